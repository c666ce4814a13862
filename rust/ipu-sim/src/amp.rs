//! The AMP (accumulating matrix product) unit of one worker context.
//!
//! The weight store keeps raw bytes (written by `ampw`) and a decoded f64
//! copy for the mode in use, re-decoded lazily when the bytes or the mode
//! change, so that an `amp` instruction is a fixed-size loop over arrays.

use ipu_isa::numerics::{f16_bits_to_f32, f64_to_f16_bits, f8_to_f32, round_f64_to_f16_value};
use ipu_isa::{AReg, AmpMode, AMP_WEIGHT_STORE_BYTES};

/// State of one context's AMP unit.
#[derive(Clone)]
pub(crate) struct AmpState {
    raw: [u8; AMP_WEIGHT_STORE_BYTES],
    /// Decoded weights `W[k][c]` at `k * 16 + c` for `decoded_mode`.
    w: [f64; 512],
    decoded_mode: Option<AmpMode>,
    /// Current-row accumulators (values exactly representable in the accumulation type).
    acc: [f64; 16],
    /// Previous-row accumulators.
    prev: [f64; 16],
    phase: u8,
    pub(crate) mode: Option<AmpMode>,
    scale: f64,
}

/// Why an `amp` instruction cannot run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ModeMismatch {
    pub(crate) current: AmpMode,
    pub(crate) requested: AmpMode,
}

impl Default for AmpState {
    fn default() -> Self {
        AmpState {
            raw: [0; AMP_WEIGHT_STORE_BYTES],
            w: [0.0; 512],
            decoded_mode: None,
            acc: [0.0; 16],
            prev: [0.0; 16],
            phase: 0,
            mode: None,
            scale: 1.0,
        }
    }
}

impl AmpState {
    /// `ampclr`, and the reset done by `run`: weights are kept.
    pub(crate) fn clear(&mut self) {
        self.acc = [0.0; 16];
        self.prev = [0.0; 16];
        self.phase = 0;
        self.mode = None;
        self.scale = 1.0;
    }

    pub(crate) fn set_scale(&mut self, scale: i8) {
        self.scale = 2f64.powi(scale as i32);
    }

    /// `ampw`: 16 bytes at chunk `index` from a quad of registers.
    pub(crate) fn write_weights(&mut self, regs: &[u32; 16], q: AReg, index: u8) {
        let at = index as usize * 16;
        for i in 0..4 {
            self.raw[at + 4 * i..at + 4 * i + 4]
                .copy_from_slice(&regs[q.first as usize + i].to_le_bytes());
        }
        self.decoded_mode = None;
    }

    fn decode(&mut self, mode: AmpMode) {
        let n = mode.k_rows() * AmpMode::COLUMNS;
        for i in 0..n {
            self.w[i] = match mode {
                AmpMode::F8 => f8_to_f32(self.raw[i]) as f64,
                AmpMode::F16 | AmpMode::F16F32 => {
                    f16_bits_to_f32(u16::from_le_bytes([self.raw[2 * i], self.raw[2 * i + 1]]))
                        as f64
                }
                AmpMode::F32 => {
                    f32::from_le_bytes(self.raw[4 * i..4 * i + 4].try_into().unwrap()) as f64
                }
            };
        }
        self.decoded_mode = Some(mode);
    }

    /// One `amp` instruction: see docs/isa.md, AMP. Reads `x` and `p` from
    /// `regs` before writing `d`.
    pub(crate) fn step(
        &mut self,
        regs: &mut [u32; 16],
        mode: AmpMode,
        d: AReg,
        x: AReg,
        p: AReg,
    ) -> Result<(), ModeMismatch> {
        match self.mode {
            Some(m) if m != mode => {
                return Err(ModeMismatch {
                    current: m,
                    requested: mode,
                })
            }
            _ => self.mode = Some(mode),
        }
        if self.decoded_mode != Some(mode) {
            self.decode(mode);
        }
        let rows = mode.rows_per_phase();
        let lanes = mode.lanes_per_phase();
        let phase = self.phase as usize;
        // Inputs for this phase, as f64.
        let mut xin = [0f64; 8];
        let mut part = [0f64; 4];
        let (x0, p0) = (x.first as usize, p.first as usize);
        match mode {
            AmpMode::F16 => {
                for (r, v) in xin.iter_mut().enumerate().take(4) {
                    *v = f16_bits_to_f32((regs[x0 + r / 2] >> (16 * (r % 2))) as u16) as f64;
                }
            }
            AmpMode::F8 => {
                for (r, v) in xin.iter_mut().enumerate() {
                    *v = f8_to_f32((regs[x0 + r / 4] >> (8 * (r % 4))) as u8) as f64 * self.scale;
                }
            }
            AmpMode::F16F32 => {
                for (r, v) in xin.iter_mut().enumerate().take(2) {
                    *v = f16_bits_to_f32((regs[x0] >> (16 * r)) as u16) as f64;
                }
            }
            AmpMode::F32 => xin[0] = f32::from_bits(regs[x0]) as f64,
        }
        match mode {
            AmpMode::F16 | AmpMode::F8 => {
                for (l, v) in part.iter_mut().enumerate() {
                    *v = f16_bits_to_f32((regs[p0 + l / 2] >> (16 * (l % 2))) as u16) as f64;
                }
            }
            AmpMode::F16F32 => {
                part[0] = f32::from_bits(regs[p0]) as f64;
                part[1] = f32::from_bits(regs[p0 + 1]) as f64;
            }
            AmpMode::F32 => part[0] = f32::from_bits(regs[p0]) as f64,
        }
        // Output the finished previous row's lanes for this phase.
        let lane0 = phase * lanes;
        match mode {
            AmpMode::F16 | AmpMode::F8 => {
                for l in 0..4 {
                    let h = f64_to_f16_bits(self.prev[lane0 + l]) as u32;
                    let reg = &mut regs[d.first as usize + l / 2];
                    let sh = 16 * (l % 2);
                    *reg = (*reg & !(0xFFFF << sh)) | (h << sh);
                }
            }
            AmpMode::F16F32 => {
                regs[d.first as usize] = (self.prev[lane0] as f32).to_bits();
                regs[d.first as usize + 1] = (self.prev[lane0 + 1] as f32).to_bits();
            }
            AmpMode::F32 => regs[d.first as usize] = (self.prev[lane0] as f32).to_bits(),
        }
        // acc[c] = round(acc[c] + sum_r W[R p + r][c] x[r] + partial), left to right in f64.
        let mut sum = [0f64; 16];
        for (r, xv) in xin.iter().enumerate().take(rows) {
            let wrow = &self.w[(rows * phase + r) * 16..(rows * phase + r) * 16 + 16];
            for c in 0..16 {
                sum[c] += wrow[c] * xv;
            }
        }
        let f16_acc = matches!(mode, AmpMode::F16 | AmpMode::F8);
        for c in 0..16 {
            let mut s = self.acc[c] + sum[c];
            if (lane0..lane0 + lanes).contains(&c) {
                s += part[c - lane0];
            }
            self.acc[c] = if f16_acc {
                round_f64_to_f16_value(s)
            } else {
                s as f32 as f64
            };
        }
        self.phase += 1;
        if self.phase as usize == mode.phases() {
            self.prev = self.acc;
            self.acc = [0.0; 16];
            self.phase = 0;
        }
        Ok(())
    }
}
