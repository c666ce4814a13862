//! Whole-graph evaluation: feeds are checked, every small model evaluates
//! deterministically, and the result agrees with an evaluation that routes
//! through .npy files.

mod common;

use std::collections::BTreeMap;

use expect_test::expect;
use ipu_graph::{DType, TensorType};
use ipu_reference::{evaluate, evaluate_all, npy, random, Tensor};

#[test]
fn feeds_are_checked() {
    let graph = common::model("gemm_small.ipug");
    let mut feeds = random::gaussian_feeds(&graph, 3);
    let mut errors = Vec::new();
    let b = feeds.remove("b").unwrap();
    errors.push(evaluate(&graph, &feeds).unwrap_err().to_string());
    feeds.insert(
        "b".into(),
        Tensor::filled(&TensorType::new(DType::F32, vec![48, 20]), 1.0),
    );
    errors.push(evaluate(&graph, &feeds).unwrap_err().to_string());
    feeds.insert("b".into(), b);
    feeds.insert(
        "c".into(),
        Tensor::filled(&TensorType::new(DType::F16, vec![33, 20]), 1.0),
    );
    errors.push(evaluate(&graph, &feeds).unwrap_err().to_string());
    expect![[r#"
        [
            "no tensor given for param `b`: f16[48, 20]",
            "tensor `b` is f32[48, 20] but the graph declares f16[48, 20]",
            "tensor `c` names no input or parameter of the graph",
        ]
    "#]]
    .assert_debug_eq(&errors);
}

/// A fingerprint of a tensor: sum, sum of squares and a few elements; enough
/// to catch any change in the reference's arithmetic or rounding points.
fn fingerprint(t: &Tensor) -> String {
    let sum: f64 = t.data().iter().sum();
    let sq: f64 = t.data().iter().map(|v| v * v).sum();
    let n = t.data().len();
    format!(
        "{} sum={sum:.6} sumsq={sq:.6} first={} last={}",
        t.ty(),
        t.data()[0],
        t.data()[n - 1]
    )
}

#[test]
fn small_models_evaluate_deterministically() {
    let mut out = String::new();
    for name in [
        "gemm_small.ipug",
        "attention_small.ipug",
        "attention_causal_small.ipug",
        "attention_cross_small.ipug",
        "attention_small_fp8.ipug",
        "mlp_small.ipug",
        "vit_block_small.ipug",
    ] {
        let graph = common::model(name);
        let feeds = random::gaussian_feeds(&graph, 2024);
        let first = evaluate(&graph, &feeds).unwrap();
        assert_eq!(
            first,
            evaluate(&graph, &feeds).unwrap(),
            "{name}: evaluation is deterministic"
        );
        for (output, t) in &first {
            assert!(
                t.data().iter().all(|v| v.is_finite()),
                "{name}: {output} is finite"
            );
            out.push_str(&format!("{name} {output}: {}\n", fingerprint(t)));
        }
    }
    expect![[r#"
        gemm_small.ipug c: f16[33, 20] sum=-0.775560 sumsq=578.616164 first=0.84228515625 last=1.1171875
        attention_small.ipug y: f16[17, 72] sum=-16.134836 sumsq=172.864647 first=-0.370849609375 last=0.250732421875
        attention_causal_small.ipug y: f16[17, 72] sum=17.165340 sumsq=361.118362 first=0.1641845703125 last=0.250732421875
        attention_cross_small.ipug y: f16[17, 72] sum=-5.939316 sumsq=153.311482 first=-0.08404541015625 last=0.134765625
        attention_small_fp8.ipug y: f16[17, 72] sum=-16.830986 sumsq=170.922164 first=-0.36474609375 last=0.2423095703125
        mlp_small.ipug y: f16[17, 76] sum=-18.339691 sumsq=1270.178685 first=0.263427734375 last=0.25634765625
        vit_block_small.ipug y: f16[17, 80] sum=-246.043762 sumsq=2994.961146 first=-0.15380859375 last=-2.234375
    "#]]
    .assert_eq(&out);
}

#[test]
fn npy_round_trip_of_feeds_gives_the_same_outputs() {
    let graph = common::model("attention_small_fp8.ipug");
    let feeds = random::gaussian_feeds(&graph, 9);
    let through_files: BTreeMap<String, Tensor> = feeds
        .iter()
        .map(|(name, t)| {
            (
                name.clone(),
                npy::parse(&npy::write(t))
                    .unwrap()
                    .to_tensor(&t.ty())
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(
        evaluate(&graph, &feeds).unwrap(),
        evaluate(&graph, &through_files).unwrap()
    );
}

#[test]
fn every_value_is_stored_in_its_dtype() {
    let graph = common::model("attention_small_fp8.ipug");
    let values = evaluate_all(&graph, &random::gaussian_feeds(&graph, 1)).unwrap();
    for (v, t) in graph.values().iter().zip(&values) {
        assert_eq!(t.ty(), v.ty, "{}", v.name);
        for &x in t.data() {
            assert_eq!(
                ipu_reference::round_to(v.ty.dtype, x),
                x,
                "{} holds a non-{} value",
                v.name,
                v.ty.dtype
            );
        }
    }
    // The fp8 cast really quantises: x8 differs from x.
    let x = graph.lookup("x").unwrap().0 as usize;
    let x8 = graph.lookup("x8").unwrap().0 as usize;
    assert_ne!(values[x].data(), values[x8].data());
}
