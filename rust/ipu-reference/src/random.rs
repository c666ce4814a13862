//! Deterministic input generators over a seeded PRNG.
//!
//! SplitMix64 expands a seed into the state of xoshiro256**, which draws the
//! numbers (both from the project's `ipu-rng`), so that the same seed gives
//! the same tensors on every machine and toolchain, forever: tests and
//! snapshots depend on it.

use std::collections::BTreeMap;

use ipu_graph::{Graph, TensorType, ValueDef};

use crate::tensor::Tensor;

pub use ipu_rng::{SplitMix64, Xoshiro256};

/// How to fill a tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fill {
    /// Every element the same.
    Constant(f64),
    /// Uniform in [low, high).
    Uniform {
        /// Inclusive lower end.
        low: f64,
        /// Exclusive upper end.
        high: f64,
    },
    /// Normal distribution by the Box-Muller transform.
    Gaussian {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
}

/// A tensor of type `ty` filled by `fill` from `seed`, each value rounded to
/// the dtype.
pub fn generate(ty: &TensorType, fill: Fill, seed: u64) -> Tensor {
    let n = ty.shape.elements() as usize;
    let mut rng = Xoshiro256::seeded(seed);
    let data: Vec<f64> = match fill {
        Fill::Constant(c) => vec![c; n],
        Fill::Uniform { low, high } => (0..n)
            .map(|_| low + (high - low) * rng.next_f64())
            .collect(),
        Fill::Gaussian { mean, std } => {
            let mut out = Vec::with_capacity(n + 1);
            while out.len() < n {
                // 1 - u lies in (0, 1], so the logarithm is finite.
                let u1 = 1.0 - rng.next_f64();
                let u2 = rng.next_f64();
                let r = (-2.0 * u1.ln()).sqrt();
                let theta = 2.0 * std::f64::consts::PI * u2;
                out.push(mean + std * r * theta.cos());
                out.push(mean + std * r * theta.sin());
            }
            out.truncate(n);
            out
        }
    };
    Tensor::new(ty.dtype, ty.shape.clone(), data).expect("length matches the shape")
}

/// A seed for the value called `name`: FNV-1a of the name mixed with `seed`,
/// so that each value's data depends only on the seed and its own name, not on
/// declaration order.
pub fn seed_for(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01B3);
    }
    SplitMix64(seed ^ h).next_u64()
}

/// Tensors for every input and parameter of `graph`, filled by `fill(kind, ty)`
/// where `kind` is `"input"` or `"param"`, each from [`seed_for`] its name.
pub fn feeds_with(
    graph: &Graph,
    seed: u64,
    fill: impl Fn(&str, &TensorType) -> Fill,
) -> BTreeMap<String, Tensor> {
    graph
        .values()
        .iter()
        .filter_map(|v| {
            let kind = match v.def {
                ValueDef::Input => "input",
                ValueDef::Param => "param",
                ValueDef::Node(_) => return None,
            };
            Some((
                v.name.clone(),
                generate(&v.ty, fill(kind, &v.ty), seed_for(seed, &v.name)),
            ))
        })
        .collect()
}

/// The standard random feeds: inputs N(0, 1); parameters of rank 2 or more
/// N(0, 1/fan_in) with fan_in the second-to-last dimension, so that
/// projections keep activations near unit scale; rank-0 and rank-1 parameters
/// (biases, gammas, betas) N(0, 0.5^2), so that they matter but do not dominate.
pub fn gaussian_feeds(graph: &Graph, seed: u64) -> BTreeMap<String, Tensor> {
    feeds_with(graph, seed, |kind, ty| {
        let dims = ty.shape.dims();
        let std = match (kind, dims.len()) {
            ("input", _) => 1.0,
            (_, r) if r >= 2 => 1.0 / (dims[r - 2] as f64).sqrt(),
            _ => 0.5,
        };
        Fill::Gaussian { mean: 0.0, std }
    })
}

/// The seed log's constant check: inputs all ones, parameters all `1/W` where
/// `W` is the parameter's second-to-last dimension (its fan-in), so every
/// projection of ones gives `f16(1/W) * W`.
pub fn constant_feeds(graph: &Graph) -> BTreeMap<String, Tensor> {
    feeds_with(graph, 0, |kind, ty| {
        let dims = ty.shape.dims();
        match (kind, dims.len()) {
            ("input", _) => Fill::Constant(1.0),
            (_, r) if r >= 2 => Fill::Constant(1.0 / dims[r - 2] as f64),
            _ => Fill::Constant(0.0),
        }
    })
}
