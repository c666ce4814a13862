//! The deterministic PRNG (splitmix64, from the project's `ipu-rng`) behind
//! synthetic phases, fuzzing and the scheduler's deterministic tie-breaking.

pub use ipu_rng::SplitMix64;
