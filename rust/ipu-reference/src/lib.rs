//! Host reference of every ipu-graph operation, and the tools around it.
//!
//! - [`Tensor`]: dtype, shape and f64 values that are exactly representable in
//!   the dtype; conversion to and from device storage bytes (f32, f16 via the
//!   `half` crate, fp8 F143 codes via [`fp8`]).
//! - [`evaluate`] / [`evaluate_all`]: run a whole graph in f64, rounding each
//!   result to its dtype where the device stores it. The operations in [`ops`]
//!   are written from the definitions and share no code with device kernels.
//! - [`npy`]: NumPy `.npy` read and write.
//! - [`random`]: deterministic constant, uniform and Gaussian generators.
//! - [`compare`]: device-versus-reference reports with a documented tolerance.
//! - [`rows`]: the tolerance rule per row of an attention's result and of
//!   values computed row by row from it ([`attention_row_atol`]), which the
//!   whole-graph check takes where it is larger than the whole output's.
//!
//! Invariant: the same graph, feeds and seed give bit-identical results on
//! every run (no threads, no hash-order iteration, fixed summation order).

pub mod compare;
mod eval;
pub mod fp8;
pub mod npy;
pub mod ops;
pub mod random;
pub mod rows;
mod tensor;

pub use compare::{
    compare, compare_values, compare_values_with, compare_with, output_checks, requantisations,
    Comparison, Expected, Mismatch, OutputCheck, Tolerance,
};
pub use eval::{evaluate, evaluate_all, EvalError};
pub use rows::attention_row_atol;
pub use tensor::{round_to, unit_roundoff, Tensor, TensorError};
