//! Records of the `schedule.json` member (docs/runtime.md) that its writer,
//! the compiler, and its reader, the runtime's profiles, share.

use serde::{Deserialize, Serialize};

/// Live bytes of one BSP step: the bytes that hold data some step still
/// needs while the step runs, as the compiler's liveness phase finds them
/// from the steps that touch each buffer (docs/compiler.md, "Liveness").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepLive {
    /// The tile with the most live bytes at some point of the step (the
    /// lowest such tile).
    pub tile: u32,
    /// Its live bytes, code, vertex states and the host command word
    /// included.
    pub bytes: u64,
    /// Of which in region 0 (standard memory).
    pub region0: u64,
    /// Of which in region 1 (interleaved memory).
    pub region1: u64,
    /// Of which always live: code and vertex states, parameters, constants
    /// and zero padding from the load.
    pub always: u64,
    /// Live bytes summed over every tile (each at its fullest point of the
    /// step).
    pub all_tiles: u64,
}
