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
