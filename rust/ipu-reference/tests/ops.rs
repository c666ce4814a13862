//! Properties and hand-computed cases of the reference operations.

use ipu_reference::ops;

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "element {i}: {x} vs {y}");
    }
}

fn transpose(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

#[test]
fn gemm_by_hand_and_with_transposes() {
    // [[1, 2, 3], [4, 5, 6]] @ [[7, 8], [9, 10], [11, 12]] = [[58, 64], [139, 154]].
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [7.0, 8.0, 9.0, 10.0, 11.0, 12.0];
    let (c, dims) = ops::gemm(&a, &[2, 3], &b, &[3, 2], false, false);
    assert_eq!(dims, vec![2, 2]);
    assert_eq!(c, vec![58.0, 64.0, 139.0, 154.0]);
    let at = transpose(&a, 2, 3);
    let bt = transpose(&b, 3, 2);
    assert_eq!(ops::gemm(&at, &[3, 2], &b, &[3, 2], true, false).0, c);
    assert_eq!(ops::gemm(&a, &[2, 3], &bt, &[2, 3], false, true).0, c);
    assert_eq!(ops::gemm(&at, &[3, 2], &bt, &[2, 3], true, true).0, c);
}

#[test]
fn gemm_broadcasts_batch_dimensions() {
    // Two batches of a against one shared b, then the same with b repeated.
    let a: Vec<f64> = (0..12).map(|x| x as f64).collect();
    let b: Vec<f64> = (0..6).map(|x| (x as f64) * 0.5 - 1.0).collect();
    let (shared, dims) = ops::gemm(&a, &[2, 2, 3], &b, &[3, 2], false, false);
    assert_eq!(dims, vec![2, 2, 2]);
    let b2: Vec<f64> = b.iter().chain(&b).copied().collect();
    assert_eq!(
        ops::gemm(&a, &[2, 2, 3], &b2, &[2, 3, 2], false, false).0,
        shared
    );
    assert_eq!(
        &shared[4..],
        &ops::gemm(&a[6..], &[2, 3], &b, &[3, 2], false, false).0[..]
    );
}

#[test]
fn add_broadcasts() {
    let (c, dims) = ops::add(
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        &[2, 3],
        &[10.0, 20.0, 30.0],
        &[3],
    );
    assert_eq!(dims, vec![2, 3]);
    assert_eq!(c, vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    let (c, dims) = ops::add(&[1.0, 2.0], &[2, 1], &[10.0, 20.0, 30.0], &[1, 3]);
    assert_eq!(dims, vec![2, 3]);
    assert_eq!(c, vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
}

#[test]
fn gelu_known_values() {
    assert_eq!(ops::gelu(0.0), 0.0);
    // 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.8411919906082768 for x = 1.
    assert!((ops::gelu(1.0) - 0.841_191_990_608_276_8).abs() < 1e-15);
    assert!((ops::gelu(-1.0) + 0.158_808_009_391_723_2).abs() < 1e-15);
    assert!(ops::gelu(-10.0).abs() < 1e-20);
    assert!((ops::gelu(10.0) - 10.0).abs() < 1e-12);
}

#[test]
fn layernorm_normalises_rows() {
    let x = [1.0, 2.0, 3.0, 4.0, -5.0, 0.0, 5.0, 10.0];
    let y = ops::layernorm(&x, 4, &[1.0; 4], &[0.0; 4], 0.0);
    for row in y.chunks(4) {
        let mean: f64 = row.iter().sum::<f64>() / 4.0;
        let var: f64 = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 4.0;
        assert!(mean.abs() < 1e-15 && (var - 1.0).abs() < 1e-12, "{row:?}");
    }
    // Gamma scales and beta shifts each column.
    let z = ops::layernorm(&x, 4, &[2.0, 2.0, 2.0, 2.0], &[1.0, 1.0, 1.0, 1.0], 0.0);
    close(
        &z,
        &y.iter().map(|v| 2.0 * v + 1.0).collect::<Vec<_>>(),
        1e-14,
    );
}

#[test]
fn softmax_rows_sum_to_one_and_ignore_shifts() {
    let x = [1.0, 2.0, 3.0, 1000.0, 1001.0, 1002.0];
    let y = ops::softmax(&x, 3);
    close(&y[..3], &y[3..], 1e-15);
    assert!((y[..3].iter().sum::<f64>() - 1.0).abs() < 1e-15);
    let e = std::f64::consts::E;
    let total = 1.0 + e + e * e;
    close(&y[..3], &[1.0 / total, e / total, e * e / total], 1e-15);
}

#[test]
fn split_and_merge_heads_are_inverse_views() {
    let x: Vec<f64> = (0..2 * 3 * 8).map(|v| v as f64).collect();
    let (s, dims) = ops::split_heads(&x, &[2, 3, 8], 4);
    assert_eq!(dims, vec![2, 4, 3, 2]);
    // Element [b=1, h=2, s=1, d=1] comes from x[b=1, s=1, 2*2+1].
    assert_eq!(s[((4 + 2) * 3 + 1) * 2 + 1], x[(3 + 1) * 8 + 5]);
    let (m, mdims) = ops::merge_heads(&s, &dims);
    assert_eq!(mdims, vec![2, 3, 8]);
    assert_eq!(m, x);
}

/// Attention must equal its unfused definition computed with the other
/// reference operations: scores = scale * q k^T, softmax, then p v.
#[test]
fn attention_equals_its_composition() {
    let (h, sq, sk, d, dv) = (2, 3, 5, 4, 6);
    let gen = |n: usize, salt: f64| -> Vec<f64> {
        (0..n).map(|i| ((i as f64) * 0.37 + salt).sin()).collect()
    };
    let (q, k, v) = (
        gen(h * sq * d, 0.1),
        gen(h * sk * d, 0.7),
        gen(h * sk * dv, 1.3),
    );
    let scale = 0.5;
    let (o, dims) = ops::attention(
        &q,
        &k,
        &v,
        &[h, sq, d],
        &[h, sk, d],
        &[h, sk, dv],
        false,
        scale,
    );
    assert_eq!(dims, vec![h, sq, dv]);
    let (s, _) = ops::gemm(&q, &[h, sq, d], &k, &[h, sk, d], false, true);
    let s: Vec<f64> = s.iter().map(|x| x * scale).collect();
    let p = ops::softmax(&s, sk);
    let (expected, _) = ops::gemm(&p, &[h, sq, sk], &v, &[h, sk, dv], false, false);
    close(&o, &expected, 1e-14);
}

/// Causal attention aligned at the bottom right: with sq = 3 and sk = 5,
/// query 0 sees keys 0..=2 and the last query sees all five.
#[test]
fn causal_attention_masks_future_keys() {
    let (sq, sk, d) = (3, 5, 2);
    let q = vec![0.0; sq * d]; // zero queries: uniform weights over visible keys
    let k: Vec<f64> = (0..sk * d).map(|i| i as f64).collect();
    let v: Vec<f64> = (0..sk).map(|j| (j * j) as f64).collect();
    let (o, _) = ops::attention(&q, &k, &v, &[sq, d], &[sk, d], &[sk, 1], true, 1.0);
    close(
        &o,
        &[
            (0.0 + 1.0 + 4.0) / 3.0,
            (0.0 + 1.0 + 4.0 + 9.0) / 4.0,
            30.0 / 5.0,
        ],
        1e-15,
    );
    let (full, _) = ops::attention(&q, &k, &v, &[sq, d], &[sk, d], &[sk, 1], false, 1.0);
    close(&full, &[6.0, 6.0, 6.0], 1e-15);
}

/// `transpose` swaps the last two axes of each batch element: by hand on
/// a [2, 2, 3] tensor, and a GEMM with a transposed operand equals the
/// GEMM of the transposed tensor.
#[test]
fn transpose_swaps_the_last_two_axes_per_batch_element() {
    let x: Vec<f64> = (0..12).map(f64::from).collect();
    assert_eq!(
        ops::transpose(&x, &[2, 2, 3]),
        [0., 3., 1., 4., 2., 5., 6., 9., 7., 10., 8., 11.]
    );
    let b: Vec<f64> = (0..6).map(|i| f64::from(i) * 0.5 - 1.0).collect();
    let (flagged, _) = ops::gemm(&x, &[2, 2, 3], &b, &[2, 3], true, false);
    let (explicit, _) = ops::gemm(
        &ops::transpose(&x, &[2, 2, 3]),
        &[2, 3, 2],
        &b,
        &[2, 3],
        false,
        false,
    );
    close(&flagged, &explicit, 0.0);
}
