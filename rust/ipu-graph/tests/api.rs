//! Tests of the builder, the verifier and the graph queries.

use expect_test::expect;
use ipu_graph::{verify, DType, Graph, Node, NodeId, Op, TensorType, Value, ValueDef, ValueId};

fn f16(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F16, dims.to_vec())
}

fn small_graph() -> Graph {
    let mut g = Graph::new("small");
    let x = g.add_input("x", f16(&[4, 8])).unwrap();
    let w = g.add_param("w", f16(&[8, 8])).unwrap();
    let h = g
        .add_op(
            "h",
            Op::Gemm {
                transpose_a: false,
                transpose_b: false,
                out: None,
            },
            &[x, w],
        )
        .unwrap();
    let a = g.add_op("a", Op::Gelu, &[h]).unwrap();
    let y = g.add_op("y", Op::Add, &[a, h]).unwrap();
    g.add_output(y).unwrap();
    g
}

#[test]
fn builder_infers_types_and_queries_work() {
    let g = small_graph();
    assert_eq!(verify(&g), Ok(()));
    let h = g.lookup("h").unwrap();
    assert_eq!(g.ty(h), &f16(&[4, 8]));
    assert_eq!(g.users(h), vec![NodeId(1), NodeId(2)]);
    assert_eq!(g.all_users()[h.0 as usize], vec![NodeId(1), NodeId(2)]);
    assert_eq!(g.def_node(h), Some(NodeId(0)));
    assert_eq!(g.def_node(g.lookup("x").unwrap()), None);
    assert_eq!(g.inputs(), vec![ValueId(0)]);
    assert_eq!(g.params(), vec![ValueId(1)]);
    assert_eq!(
        g.topological_order(),
        Some(vec![NodeId(0), NodeId(1), NodeId(2)])
    );
}

#[test]
fn builder_rejects_bad_definitions() {
    let mut g = small_graph();
    let x = g.lookup("x").unwrap();
    let errors = [
        g.add_input("x", f16(&[1])).unwrap_err().to_string(),
        g.add_input("9x", f16(&[1])).unwrap_err().to_string(),
        g.add_input("z", f16(&[0, 3])).unwrap_err().to_string(),
        g.add_op("s", Op::SplitHeads { heads: 3 }, &[x])
            .unwrap_err()
            .to_string(),
        g.add_op("s", Op::Gelu, &[ValueId(99)])
            .unwrap_err()
            .to_string(),
        g.add_output(g.lookup("y").unwrap())
            .unwrap_err()
            .to_string(),
    ];
    expect![[r#"
        [
            "value `x` is already defined",
            "`9x` is not a valid name (expected a letter or _ then letters, digits, _ or .)",
            "value `z` has type f16[0, 3]: dimensions must be at least 1",
            "defining `s`: split_heads: operand x has type f16[4, 8]: last dimension 8 is not divisible by heads=3",
            "value id 99 does not exist",
            "value `y` is already an output",
        ]
    "#]]
    .assert_debug_eq(&errors);
}

/// The verifier is an independent checker: corrupt a graph through the raw
/// constructor in several ways and check that every corruption is reported.
#[test]
fn verifier_reports_every_corruption() {
    let g = small_graph();
    let mut values: Vec<Value> = g.values().to_vec();
    let mut nodes: Vec<Node> = g.nodes().to_vec();
    // Wrong recorded type.
    values[2].ty = f16(&[4, 4]);
    // Use before definition: the gelu uses y, defined later.
    nodes[1].args = vec![ValueId(4)];
    // Duplicate name.
    values[3].name = "x".into();
    // A param claiming to be a node result.
    values[1].def = ValueDef::Node(NodeId(7));
    let broken = Graph::from_parts(
        "bad name".into(),
        values,
        nodes,
        vec![ValueId(4), ValueId(4), ValueId(40)],
    );
    let errors: Vec<String> = verify(&broken)
        .unwrap_err()
        .iter()
        .map(|e| e.to_string())
        .collect();
    expect![[r#"
        [
            "model name `bad name` is not an identifier",
            "value `w` names a defining node that does not define it",
            "value `x` is defined more than once",
            "`h` is recorded as f16[4, 4] but its operation gives f16[4, 8]",
            "`x`: operand 0 (`y`) is not defined before its use",
            "`y`: add: shape mismatch: a is f16[4, 8] and b is f16[4, 4] (shapes do not broadcast)",
            "`y` is an output twice",
            "output id 40 does not exist",
        ]
    "#]]
    .assert_debug_eq(&errors);
    let empty = Graph::from_parts("e".into(), vec![], vec![], vec![]);
    assert_eq!(
        verify(&empty).unwrap_err()[0].to_string(),
        "the graph has no output"
    );
}

#[test]
fn topological_order_detects_cycles() {
    let g = small_graph();
    let mut nodes: Vec<Node> = g.nodes().to_vec();
    // h = gemm(x, y) while y depends on h: a cycle.
    nodes[0].args[1] = ValueId(4);
    let cyclic = Graph::from_parts("c".into(), g.values().to_vec(), nodes, g.outputs().to_vec());
    assert_eq!(cyclic.topological_order(), None);
    assert!(verify(&cyclic).is_err());
}

#[test]
fn arch_peak_is_the_one_summary_uses() {
    // The summary's compute bound divides by the chip peak from ipu-arch.
    assert_eq!(
        ipu_arch::compute_bound_cycles(188_416, ipu_arch::TILES_PER_CHIP),
        1
    );
}

#[test]
fn repeat_blocks_report_each_iterations_definitions() {
    let text = "model m\ninput x: f16[2, 4]\nrepeat 3 carry h = x\n  param w: f16[4, 4]\n  a = gemm(h, w)\n  h = add(a, h)\nend\noutput h\n";
    let (g, repeats) = ipu_graph::parse_with_repeats("m.ipug", text).unwrap();
    assert_eq!(g, ipu_graph::parse("m.ipug", text).unwrap());
    let [r] = repeats.as_slice() else {
        panic!("one repeat block: {repeats:?}")
    };
    assert_eq!((r.line, r.count), (3, 3));
    assert_eq!(r.carries, vec![("h".to_string(), "x".to_string())]);
    let names: Vec<String> = r.defined.iter().map(|d| d.join(" ")).collect();
    assert_eq!(names, ["w.0 a.0 h.0", "w.1 a.1 h.1", "w.2 a.2 h"]);
    // Entry j of every iteration is the same statement.
    for d in &r.defined {
        let ops: Vec<String> = d
            .iter()
            .map(|n| {
                format!("{:?}", g.value(g.lookup(n).unwrap()).def)
                    .chars()
                    .take(4)
                    .collect()
            })
            .collect();
        assert_eq!(ops[0], "Para");
        assert_eq!(ops[1], "Node");
    }
    let (_, none) =
        ipu_graph::parse_with_repeats("m.ipug", "model m\ninput x: f16[2]\noutput x\n").unwrap();
    assert!(none.is_empty());
}
