//! The device kernels the compiler calls and their vertex-state contracts
//! (docs/kernels.md). Each struct here mirrors the state layout documented
//! at the top of the kernel's source in device/.

/// Words in the vertex state of `gemm_f16`.
pub const GEMM_STATE_WORDS: usize = 11;

/// The vertex state of `gemm_f16` (device/gemm_f16.S): one worker's share of
/// a GEMM, `m` rows by `ncb` column blocks of 16, over `nkb` K blocks of 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmState {
    /// Address of A[row 0, k 0] (region 1).
    pub a: u32,
    /// A row stride in bytes.
    pub rs_a: u32,
    /// Address of B[k 0, first column] (region 1, 16-aligned).
    pub b: u32,
    /// B row stride in bytes.
    pub rs_b: u32,
    /// C buffer written by K block 0, at row 0 and the first column.
    pub c_first: u32,
    /// C buffer written by K block 1, same position.
    pub c_second: u32,
    /// C row stride in bytes.
    pub rs_c: u32,
    /// Address of 8 zero bytes (the partials of K block 0).
    pub zero: u32,
    /// Rows.
    pub m: u32,
    /// K blocks of 16.
    pub nkb: u32,
    /// Column blocks of 16.
    pub ncb: u32,
}

impl GemmState {
    /// The state words in the kernel's order.
    pub fn words(&self) -> [u32; GEMM_STATE_WORDS] {
        [
            self.a,
            self.rs_a,
            self.b,
            self.rs_b,
            self.c_first,
            self.c_second,
            self.rs_c,
            self.zero,
            self.m,
            self.nkb,
            self.ncb,
        ]
    }
}

/// Words in the vertex state of `reduce_f32` (device/reduce_f32.S): source
/// (partial 0, row 0), bytes between partials, partial count, source row
/// stride, destination, destination row stride, rows, groups of four
/// elements per row, bias address (epilogues 1 and 2).
pub const REDUCE_STATE_WORDS: usize = 9;
