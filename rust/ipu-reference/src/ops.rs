//! f64 implementations of every graph operation.
//!
//! These are written from the mathematical definitions in docs/graph-format.md
//! and share no code with the compiler's device kernels, so that agreement
//! between the two means something. Each function returns unrounded f64
//! results; the evaluator rounds them to the result dtype, which is where the
//! device stores them.

use ipu_graph::broadcast_shapes;

/// The row-major offset in an operand of shape `dims` of the element that
/// broadcasting maps to `index` of the broadcast result (aligned at the right;
/// size-1 dimensions repeat).
fn broadcast_offset(index: &[usize], dims: &[usize]) -> usize {
    let skip = index.len() - dims.len();
    let mut offset = 0;
    for (k, &d) in dims.iter().enumerate() {
        let i = if d == 1 { 0 } else { index[skip + k] };
        offset = offset * d + i;
    }
    offset
}

/// Advances a row-major multi-index; returns false after the last one.
fn next_index(index: &mut [usize], dims: &[usize]) -> bool {
    for k in (0..dims.len()).rev() {
        index[k] += 1;
        if index[k] < dims[k] {
            return true;
        }
        index[k] = 0;
    }
    false
}

/// Calls `f(i, index)` for each row-major index `i` of a shape.
fn for_each_index(dims: &[usize], mut f: impl FnMut(usize, &[usize])) {
    if dims.contains(&0) {
        return;
    }
    let mut index = vec![0; dims.len()];
    let mut i = 0;
    loop {
        f(i, &index);
        i += 1;
        if !next_index(&mut index, dims) {
            break;
        }
    }
}

/// Batched `a @ b` with optional transposes and broadcast batch dimensions.
pub fn gemm(
    a: &[f64],
    a_dims: &[usize],
    b: &[f64],
    b_dims: &[usize],
    transpose_a: bool,
    transpose_b: bool,
) -> (Vec<f64>, Vec<usize>) {
    let (ar, ac) = (a_dims[a_dims.len() - 2], a_dims[a_dims.len() - 1]);
    let (br, bc) = (b_dims[b_dims.len() - 2], b_dims[b_dims.len() - 1]);
    let (m, k) = if transpose_a { (ac, ar) } else { (ar, ac) };
    let n = if transpose_b { br } else { bc };
    let a_batch = &a_dims[..a_dims.len() - 2];
    let b_batch = &b_dims[..b_dims.len() - 2];
    let batch =
        broadcast_shapes(a_batch, b_batch).expect("the graph verifier checked broadcasting");
    let batches: usize = batch.iter().product();
    let mut out = vec![0.0; batches * m * n];
    // Pack each batch's operands as rows of `a` (m x k) and columns of `b`
    // (n x k) so that every output element is a dot product of two contiguous
    // slices; the sums are the same, only the memory order changes.
    let mut a_rows = vec![0.0; m * k];
    let mut b_cols = vec![0.0; n * k];
    let mut bi = 0;
    for_each_index(&batch, |_, index| {
        let a0 = broadcast_offset(index, a_batch) * ar * ac;
        let b0 = broadcast_offset(index, b_batch) * br * bc;
        for i in 0..m {
            for p in 0..k {
                a_rows[i * k + p] = if transpose_a {
                    a[a0 + p * ac + i]
                } else {
                    a[a0 + i * ac + p]
                };
            }
        }
        for j in 0..n {
            for p in 0..k {
                b_cols[j * k + p] = if transpose_b {
                    b[b0 + j * bc + p]
                } else {
                    b[b0 + p * bc + j]
                };
            }
        }
        for i in 0..m {
            let row = &a_rows[i * k..(i + 1) * k];
            for j in 0..n {
                let col = &b_cols[j * k..(j + 1) * k];
                out[(bi * m + i) * n + j] = row.iter().zip(col).map(|(x, y)| x * y).sum();
            }
        }
        bi += 1;
    });
    let mut dims = batch;
    dims.extend([m, n]);
    (out, dims)
}

/// Elementwise `a + b` with numpy broadcasting.
pub fn add(a: &[f64], a_dims: &[usize], b: &[f64], b_dims: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let dims = broadcast_shapes(a_dims, b_dims).expect("the graph verifier checked broadcasting");
    let mut out = vec![0.0; dims.iter().product()];
    for_each_index(&dims, |i, index| {
        out[i] = a[broadcast_offset(index, a_dims)] + b[broadcast_offset(index, b_dims)];
    });
    (out, dims)
}

/// GELU, tanh approximation.
pub fn gelu(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// Layer normalisation over rows of length `n`, biased variance.
pub fn layernorm(x: &[f64], n: usize, gamma: &[f64], beta: &[f64], epsilon: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(n) {
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let inv = 1.0 / (var + epsilon).sqrt();
        out.extend(
            row.iter()
                .enumerate()
                .map(|(j, v)| (v - mean) * inv * gamma[j] + beta[j]),
        );
    }
    out
}

/// Softmax over rows of length `n`, shifted by the row maximum for stability.
pub fn softmax(x: &[f64], n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(n) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        out.extend(exps.iter().map(|e| e / sum));
    }
    out
}

/// `[..., S, H*D]` to `[..., H, S, D]`.
pub fn split_heads(x: &[f64], dims: &[usize], heads: usize) -> (Vec<f64>, Vec<usize>) {
    let (s, hd) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let d = hd / heads;
    let mut out = vec![0.0; x.len()];
    for (b, block) in x.chunks_exact(s * hd).enumerate() {
        let base = b * s * hd;
        for si in 0..s {
            for h in 0..heads {
                for di in 0..d {
                    out[base + (h * s + si) * d + di] = block[si * hd + h * d + di];
                }
            }
        }
    }
    let mut out_dims = dims[..dims.len() - 2].to_vec();
    out_dims.extend([heads, s, d]);
    (out, out_dims)
}

/// `[..., H, S, D]` to `[..., S, H*D]`.
pub fn merge_heads(x: &[f64], dims: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let (h, s, d) = (
        dims[dims.len() - 3],
        dims[dims.len() - 2],
        dims[dims.len() - 1],
    );
    let mut out = vec![0.0; x.len()];
    for (b, block) in x.chunks_exact(h * s * d).enumerate() {
        let base = b * h * s * d;
        for hi in 0..h {
            for si in 0..s {
                for di in 0..d {
                    out[base + si * h * d + hi * d + di] = block[(hi * s + si) * d + di];
                }
            }
        }
    }
    let mut out_dims = dims[..dims.len() - 3].to_vec();
    out_dims.extend([s, h * d]);
    (out, out_dims)
}

/// `x` with its last two axes swapped, batch element by batch element.
pub fn transpose(x: &[f64], dims: &[usize]) -> Vec<f64> {
    let (m, n) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let mut out = vec![0.0; x.len()];
    for (b, block) in x.chunks_exact((m * n).max(1)).enumerate() {
        let base = b * m * n;
        for i in 0..m {
            for j in 0..n {
                out[base + j * m + i] = block[i * n + j];
            }
        }
    }
    out
}

/// Attention per leading index: `softmax(scale * q k^T [masked]) v`.
///
/// The scores and probabilities stay in f64 and are never rounded: a fused
/// (flash) kernel keeps them in registers, and the unfused composition
/// (gemm, softmax, gemm) is a different graph with its own rounding points.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    q_dims: &[usize],
    k_dims: &[usize],
    v_dims: &[usize],
    causal: bool,
    scale: f64,
) -> (Vec<f64>, Vec<usize>) {
    let (sq, d) = (q_dims[q_dims.len() - 2], q_dims[q_dims.len() - 1]);
    let sk = k_dims[k_dims.len() - 2];
    let dv = v_dims[v_dims.len() - 1];
    let lead: usize = q_dims[..q_dims.len() - 2].iter().product();
    let mut out = vec![0.0; lead * sq * dv];
    let mut scores = vec![0.0; sk];
    for l in 0..lead {
        let (q0, k0, v0, o0) = (l * sq * d, l * sk * d, l * sk * dv, l * sq * dv);
        for i in 0..sq {
            // Bottom-right alignment: query i sees keys 0..=i + (sk - sq).
            let visible = if causal { i + (sk - sq) + 1 } else { sk };
            let mut max = f64::NEG_INFINITY;
            for (j, score) in scores.iter_mut().enumerate().take(visible) {
                let dot: f64 = (0..d).map(|p| q[q0 + i * d + p] * k[k0 + j * d + p]).sum();
                *score = scale * dot;
                max = max.max(*score);
            }
            let mut sum = 0.0;
            for score in scores.iter_mut().take(visible) {
                *score = (*score - max).exp();
                sum += *score;
            }
            for e in 0..dv {
                let acc: f64 = (0..visible).map(|j| scores[j] * v[v0 + j * dv + e]).sum();
                out[o0 + i * dv + e] = acc / sum;
            }
        }
    }
    let mut dims = q_dims[..q_dims.len() - 2].to_vec();
    dims.extend([sq, dv]);
    (out, dims)
}
