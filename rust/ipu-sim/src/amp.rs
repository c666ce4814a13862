//! The AMP (accumulating matrix product) unit of one worker context.
//!
//! The weight store keeps raw bytes (written by `ampw`) and a decoded f64
//! copy for the mode in use, re-decoded lazily when the bytes or the mode
//! change, so that an `amp` instruction is a fixed-size loop over arrays.

use ipu_isa::numerics::{
    canonical_f32_bits, f16_bits_to_f32, f64_to_f16_bits, f8_to_f32, round_f64_to_f16_value,
};
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
    /// `prev` as f16 bits (f16-accumulating modes), for the output lanes.
    prev_bits: [u16; 16],
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
            prev_bits: [0; 16],
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
        self.prev_bits = [0; 16];
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
        let phase = self.phase as usize;
        let (x0, p0, d0) = (x.first as usize, p.first as usize, d.first as usize);
        let h = |bits: u32| f16_bits_to_f32(bits as u16) as f64;
        let f = |bits: u32| f32::from_bits(bits) as f64;
        // Emit the finished previous row's lanes of this phase, then
        // accumulate. Registers are read before `d` is written.
        match mode {
            AmpMode::F16 => {
                let xv = [
                    h(regs[x0]),
                    h(regs[x0] >> 16),
                    h(regs[x0 + 1]),
                    h(regs[x0 + 1] >> 16),
                ];
                let pv = [
                    h(regs[p0]),
                    h(regs[p0] >> 16),
                    h(regs[p0 + 1]),
                    h(regs[p0 + 1] >> 16),
                ];
                self.emit_f16(regs, d0, phase);
                self.accumulate::<4, 4>(phase, &xv, &pv, true);
            }
            AmpMode::F8 => {
                let mut xv = [0f64; 8];
                for (r, v) in xv.iter_mut().enumerate() {
                    *v = f8_to_f32((regs[x0 + r / 4] >> (8 * (r % 4))) as u8) as f64 * self.scale;
                }
                let pv = [
                    h(regs[p0]),
                    h(regs[p0] >> 16),
                    h(regs[p0 + 1]),
                    h(regs[p0 + 1] >> 16),
                ];
                self.emit_f16(regs, d0, phase);
                self.accumulate::<8, 4>(phase, &xv, &pv, true);
            }
            AmpMode::F16F32 => {
                let xv = [h(regs[x0]), h(regs[x0] >> 16)];
                let pv = [f(regs[p0]), f(regs[p0 + 1])];
                regs[d0] = canonical_f32_bits(self.prev[2 * phase] as f32);
                regs[d0 + 1] = canonical_f32_bits(self.prev[2 * phase + 1] as f32);
                self.accumulate::<2, 2>(phase, &xv, &pv, false);
            }
            AmpMode::F32 => {
                let xv = [f(regs[x0])];
                let pv = [f(regs[p0])];
                regs[d0] = canonical_f32_bits(self.prev[phase] as f32);
                self.accumulate::<1, 1>(phase, &xv, &pv, false);
            }
        }
        self.phase += 1;
        if self.phase as usize == mode.phases() {
            self.prev = self.acc;
            if matches!(mode, AmpMode::F16 | AmpMode::F8) {
                for (b, v) in self.prev_bits.iter_mut().zip(&self.prev) {
                    *b = f64_to_f16_bits(*v);
                }
            }
            self.acc = [0.0; 16];
            self.phase = 0;
        }
        Ok(())
    }

    /// Writes the four f16 lanes of the previous row for `phase` into the pair at `d0`.
    #[inline(always)]
    fn emit_f16(&self, regs: &mut [u32; 16], d0: usize, phase: usize) {
        let b = &self.prev_bits[4 * phase..4 * phase + 4];
        regs[d0] = b[0] as u32 | (b[1] as u32) << 16;
        regs[d0 + 1] = b[2] as u32 | (b[3] as u32) << 16;
    }

    /// `acc[c] = round(acc[c] + sum_r W[R p + r][c] x[r] + partial)` with the
    /// products summed in increasing r, then the accumulator, then the partial.
    #[inline(always)]
    fn accumulate<const R: usize, const L: usize>(
        &mut self,
        phase: usize,
        x: &[f64; R],
        part: &[f64; L],
        f16: bool,
    ) {
        let base = phase * R * 16;
        let w: &[f64; 512] = &self.w;
        let mut s = [0f64; 16];
        for (r, xv) in x.iter().enumerate() {
            let row: &[f64; 16] = w[base + 16 * r..base + 16 * r + 16].try_into().unwrap();
            for c in 0..16 {
                s[c] += row[c] * xv;
            }
        }
        for (sc, ac) in s.iter_mut().zip(&self.acc) {
            *sc += ac;
        }
        // s = prod + acc equals acc + prod exactly (addition commutes).
        for (l, pv) in part.iter().enumerate() {
            s[phase * L + l] += pv;
        }
        if f16 {
            // Branch-free nearest-even rounding of all lanes whose result is
            // zero or a normal f16; the rare others take the general path.
            const SIGN: u64 = 1 << 63;
            const MIN_NORMAL: u64 = 0x3F10_0000_0000_0000; // 2^-14
            const ROUNDS_TO_INF: u64 = 0x40EF_FE00_0000_0000; // 65520.0
            let mut all_fast = true;
            let mut out = [0f64; 16];
            for c in 0..16 {
                let b = s[c].to_bits();
                let mag = b & !SIGN;
                let r = (mag + (1u64 << 41) - 1 + ((mag >> 42) & 1)) & !((1u64 << 42) - 1);
                // Zero, or 2^-14 <= |s| < 65520 (whose rounding stays finite and normal).
                all_fast &=
                    (mag == 0) | (mag.wrapping_sub(MIN_NORMAL) < ROUNDS_TO_INF - MIN_NORMAL);
                out[c] = f64::from_bits(r | (b & SIGN));
            }
            if !all_fast {
                for (o, sc) in out.iter_mut().zip(&s) {
                    *o = round_f64_to_f16_value(*sc);
                }
            }
            self.acc = out;
        } else {
            for (ac, sc) in self.acc.iter_mut().zip(&s) {
                *ac = *sc as f32 as f64;
            }
        }
    }
}
