//! Comparison reports and the tolerance rule.

use expect_test::expect;
use ipu_graph::{DType, Shape};
use ipu_reference::{compare, Expected, Tensor, Tolerance};

#[test]
fn tolerance_rule_matches_the_documentation() {
    let t = Tolerance::for_output(DType::F16, 1152, &[1.0; 4]);
    assert_eq!(t.rtol, 4.0 * 2f64.powi(-11));
    assert!((t.atol - 2f64.powi(-11) * 1152f64.sqrt()).abs() < 1e-15);
    // f32 outputs: four times the atol, for the device's f32 accumulation.
    let t32 = Tolerance::for_output(DType::F32, 1, &[2.0; 4]);
    assert_eq!(t32.atol, 4.0 * 2.0 * 2f64.powi(-24));
    assert_eq!(t32.rtol, 4.0 * 2f64.powi(-24));
    assert!(!t.accepts(f64::NAN, 1.0));
}

#[test]
fn requantised_outputs_widen_atol_per_cast_of_a_computed_value() {
    let g = ipu_graph::parse(
        "m.ipug",
        "model m\ninput x: f16[4, 8]\nparam w: fp8[8, 8]\nparam v: fp8[8, 8]\nx8 = cast(x, to=fp8)\nh = gemm(x8, w)\nh8 = cast(h, to=fp8<-2>)\ny = gemm(h8, v)\noutput y\n",
    )
    .unwrap();
    // The cast of the host input is exact on both sides; the cast of `h` is not.
    let u16 = 2f64.powi(-11);
    assert_eq!(ipu_reference::requantisations(&g), [u16]);
    let plain = Tolerance::for_output(DType::F16, 8, &[1.0; 4]);
    let t = Tolerance::for_output_requantised(DType::F16, 8, &[1.0; 4], &[u16]);
    let u8 = 2f64.powi(-4);
    assert!((t.atol - plain.atol - 10.0 * (u16 / u8).sqrt() * u8).abs() < 1e-15);
    assert_eq!(t.rtol, plain.rtol);
}

#[test]
fn report_names_every_mismatch_detail() {
    let shape = Shape::new([2, 3, 4]);
    let reference: Vec<f64> = (0..24).map(|i| i as f64 * 0.25).collect();
    let mut device = reference.clone();
    device[5] += 1.0; // [0, 1, 1]
    device[13] = f64::NAN; // [1, 0, 1]
    device[22] -= 0.5; // [1, 2, 2]
    let reference = Tensor::new(DType::F32, shape.clone(), reference).unwrap();
    let device = Tensor::new(DType::F32, shape, device).unwrap();
    let tolerance = Tolerance {
        atol: 1e-3,
        rtol: 1e-3,
    };
    let report = compare(&device, &reference, tolerance).unwrap();
    assert!(!report.passed());
    assert_eq!(report.mismatches_by_column, vec![0, 2, 1, 0]);
    assert_eq!(
        report.expected,
        Expected::Range {
            min: 0.0,
            max: 5.75
        }
    );
    expect![[r#"
        FAIL: checks=24 mismatches=3 (12.500%) max_abs_error=inf max_rel_error=inf cosine=NaN
          tolerance: |device - reference| <= 1.000000e-3 + 1.000000e-3 * |reference|
          expected: elements in [0.000000e0, 5.750000e0]
          largest error at [1, 0, 1]
          first mismatch at [0, 1, 1]: device 2.25 reference 1.25
          mismatches by column (column:count): 1:2 2:1
    "#]]
    .assert_eq(&report.to_string());
}

#[test]
fn passing_report_and_shape_errors() {
    let a = Tensor::new(DType::F16, Shape::new([2, 2]), vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let report = compare(
        &a,
        &a,
        Tolerance {
            atol: 0.0,
            rtol: 0.0,
        },
    )
    .unwrap();
    assert!(report.passed());
    assert_eq!(report.cosine, 1.0);
    let b = Tensor::new(DType::F16, Shape::new([4]), vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    expect!["cannot compare: device output is [2, 2] but the reference is [4]"]
        .assert_eq(&compare(&a, &b, report.tolerance).unwrap_err().to_string());
}

/// A causal attention over three projections, 2 heads of 4 over 16 tokens.
fn causal_attention(causal: bool) -> ipu_graph::Graph {
    let text = format!(
        "model m\ninput x: f16[16, 8]\nparam wq: f16[8, 8]\nparam wk: f16[8, 8]\nparam wv: f16[8, 8]\n\
         q = gemm(x, wq)\nk = gemm(x, wk)\nv = gemm(x, wv)\nqh = split_heads(q, heads=2)\n\
         kh = split_heads(k, heads=2)\nvh = split_heads(v, heads=2)\no = attention(qh, kh, vh, causal={causal})\n\
         y = merge_heads(o)\noutput y\n"
    );
    ipu_graph::parse("m.ipug", &text).unwrap()
}

#[test]
fn each_attention_query_row_gets_the_rules_atol_of_its_own_size() {
    let g = causal_attention(true);
    let feeds = ipu_reference::random::gaussian_feeds(&g, 7);
    let values = ipu_reference::evaluate_all(&g, &feeds).unwrap();
    let id = |name: &str| g.lookup(name).unwrap();
    let k = ipu_graph::analysis::max_reduction_length(&g);
    let row_atol =
        ipu_reference::attention_row_atol(&g, id("o"), &values[id("o").0 as usize], (k, &[]))
            .unwrap();
    // Query 0 sees key 0 only: its row of head 0 is v's row 0 of head 0,
    // and its atol is the rule's for those four values.
    let o = &values[id("o").0 as usize];
    let v = &values[id("v").0 as usize];
    assert_eq!(o.data()[..4], v.data()[..4]);
    let t0 = Tolerance::for_output(DType::F16, k, &v.data()[..4]);
    assert_eq!(row_atol[..4], [t0.atol; 4]);
    // Query 5 averages six keys: a smaller row, a smaller atol.
    let t5 = Tolerance::for_output(DType::F16, k, &o.data()[5 * 4..6 * 4]);
    assert_eq!(row_atol[5 * 4], t5.atol);
    assert!(t5.atol < t0.atol);
    // The merged result has the same atol per element, moved with it.
    let merged =
        ipu_reference::attention_row_atol(&g, id("y"), &values[id("y").0 as usize], (k, &[]))
            .unwrap();
    assert_eq!(merged[4..8], row_atol[16 * 4..17 * 4]); // head 1, query 0
                                                        // The outputs' checks carry it.
    let checks = ipu_reference::output_checks(&g, &feeds).unwrap();
    assert_eq!(checks[0].row_atol.as_deref(), Some(&merged[..]));
    // Values that are no attention's result get none.
    assert!(
        ipu_reference::attention_row_atol(&g, id("v"), &values[id("v").0 as usize], (k, &[]))
            .is_none()
    );
    assert!(
        ipu_reference::attention_row_atol(&g, id("x"), &values[id("x").0 as usize], (k, &[]))
            .is_none()
    );
}

#[test]
fn row_atol_passes_a_large_rows_rounding_and_still_fails_a_wrong_mask() {
    let g = causal_attention(true);
    let feeds = ipu_reference::random::gaussian_feeds(&g, 11);
    let checks = ipu_reference::output_checks(&g, &feeds).unwrap();
    let y = &checks[0];
    let row_atol = y.row_atol.as_ref().unwrap();
    // Query 0's row (v's row 0) is larger than the output's rms, so an
    // error of 90% of its own atol passes with the row's atol and fails
    // the whole output's.
    let mut shifted = y.reference.data().to_vec();
    for (e, x) in shifted.iter_mut().enumerate().take(8) {
        *x += 0.9 * (row_atol[e] + y.tolerance.rtol * x.abs());
    }
    let shifted = shifted.iter().map(|&x| x as f32 as f64).collect();
    let device = Tensor::new(DType::F32, y.reference.shape().clone(), shifted).unwrap();
    let plain = ipu_reference::compare(&device, &y.reference, y.tolerance).unwrap();
    let with = y.compare(&device).unwrap();
    assert!(with.passed(), "{with}");
    assert!(!plain.passed(), "{plain}");
    assert!(with.to_string().contains("atol of each row where larger"));
    // A device that ignores the causal mask is wrong by the size of the
    // values in every row but the last.
    let unmasked = causal_attention(false);
    let wrong = ipu_reference::evaluate_all(&unmasked, &feeds).unwrap();
    let wrong = &wrong[unmasked.lookup("y").unwrap().0 as usize];
    let report = y.compare(wrong).unwrap();
    assert!(report.mismatches >= 100, "{report}");
}

#[test]
fn rows_computed_row_by_row_from_an_attention_are_checked_per_row() {
    let g = ipu_graph::parse(
        "m.ipug",
        "model m\ninput x: f16[16, 8]\nparam wq: f16[8, 8]\nparam wk: f16[8, 8]\nparam wv: f16[8, 8]\n\
         param wo: f16[8, 6]\nparam bo: f16[6]\nparam g: f16[6]\nparam b: f16[6]\nparam w2: f16[16, 4]\n\
         q = gemm(x, wq)\nk = gemm(x, wk)\nv = gemm(x, wv)\nqh = split_heads(q, heads=2)\n\
         kh = split_heads(k, heads=2)\nvh = split_heads(v, heads=2)\no = attention(qh, kh, vh, causal=true)\n\
         m = merge_heads(o)\np = gemm(m, wo)\npb = add(p, bo)\nn = layernorm(pb, g, b)\n\
         t = gemm(n, w2, transpose_a=true)\noutput n\noutput t\n",
    )
    .unwrap();
    let rows = ipu_reference::rows::attention_rows(&g);
    let row = |name: &str| rows[g.lookup(name).unwrap().0 as usize];
    // Inputs, parameters and the projections before the attention: none.
    for name in ["x", "wq", "q", "v", "vh"] {
        assert_eq!(row(name), None, "{name}");
    }
    // The attention's result and its merged heads: a head's 4 values.
    assert_eq!(row("o"), Some(4));
    assert_eq!(row("m"), Some(4));
    // Row by row from them: the last axis.
    for name in ["p", "pb", "n"] {
        assert_eq!(row(name), Some(6), "{name}");
    }
    // A transposed A reads every row into each output row.
    assert_eq!(row("t"), None);
}
