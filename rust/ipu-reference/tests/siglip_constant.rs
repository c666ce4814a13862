//! The seed log's constant check on the SigLIP attention model.
//!
//! With an all-ones input and every weight f16(1/1152), each projection
//! element is f16(1/1152) * 1152 = 0.999755859375 exactly (the seed prints
//! 0.999756). That value is not an f16: it lies exactly halfway between the
//! f16 neighbours 0.99951171875 and 1.0, so storing q, k and v as f16 rounds
//! them to the even neighbour, 1.0. Attention of equal keys averages the
//! values, so the f16 model's every output is exactly 1.0, which the
//! documented f16 tolerance accepts against the exact 0.999756. A variant
//! whose projections and attention are kept in f32 reproduces 0.999755859375
//! bit for bit.

mod common;

use ipu_graph::{DType, Op, TensorType};
use ipu_reference::{compare_values, evaluate, random, Tolerance};

const EXACT: f64 = 0.999_755_859_375;

#[test]
fn constant_inputs_reproduce_the_seed_expectation() {
    let graph = common::model("siglip_attention.ipug");
    let feeds = random::constant_feeds(&graph);
    assert_eq!(
        feeds["wq"].data()[0],
        0.000_867_843_627_929_687_5,
        "f16(1/1152)"
    );
    assert_eq!(feeds["wq"].data()[0] * 1152.0, EXACT);

    let outputs = evaluate(&graph, &feeds).unwrap();
    let y = &outputs["y"];
    assert_eq!(y.ty(), TensorType::new(DType::F16, vec![729, 1152]));
    assert!(
        y.data().iter().all(|&v| v == 1.0),
        "f16 storage rounds the tie to 1.0"
    );

    let k = ipu_graph::analysis::max_reduction_length(&graph);
    let expected = vec![EXACT; y.data().len()];
    let tolerance = Tolerance::for_output(DType::F16, k, &expected);
    let report = compare_values(y, &expected, tolerance).unwrap();
    assert!(report.passed(), "{report}");
    assert_eq!(report.checks, 839_808);

    // The seed's failing device value must fail the same check.
    let mut seed_device = y.data().to_vec();
    seed_device[0] = 1.0429741;
    let seed = ipu_reference::Tensor::new(DType::F16, y.shape().clone(), seed_device).unwrap();
    let failed = compare_values(&seed, &expected, tolerance).unwrap();
    assert_eq!(failed.mismatches, 1);
    assert_eq!(failed.first_mismatch.unwrap().index, vec![0, 0]);
}

#[test]
fn f32_projections_give_the_exact_value() {
    // The same model with q, k, v produced in f32 (the AMP accumulates in f32)
    // and attention in f32: nothing rounds the tie away.
    let text = std::fs::read_to_string(
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
            .join("../../models/siglip_attention.ipug"),
    )
    .unwrap()
    .replace("= gemm(x, wq)", "= gemm(x, wq, out=f32)")
    .replace("= gemm(x, wk)", "= gemm(x, wk, out=f32)")
    .replace("= gemm(x, wv)", "= gemm(x, wv, out=f32)");
    let graph = ipu_graph::parse("siglip_attention_f32", &text).unwrap();
    let q = graph.lookup("q").unwrap();
    assert!(matches!(
        graph.node(graph.def_node(q).unwrap()).op,
        Op::Gemm {
            out: Some(DType::F32),
            ..
        }
    ));
    let outputs = evaluate(&graph, &random::constant_feeds(&graph)).unwrap();
    let y = &outputs["y"];
    assert_eq!(y.dtype(), DType::F32);
    assert!(
        y.data().iter().all(|&v| v == EXACT),
        "every output is 0.999755859375"
    );
}
