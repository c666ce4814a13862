//! The ipu-stack graph compiler (work in progress).
pub mod kernels;
