//! Semantics of the arithmetic-slot instructions other than AMP: float
//! vector and scalar operations, reductions, conversions and shuffles. Each
//! works on the context's float register file in place (docs/isa.md, section 3).

use ipu_isa::numerics::{
    canonical_f32_bits, f16_bits_to_f32, f64_to_f16_bits, f64_to_f16_bits_sr, f64_to_f8, f8_to_f64,
    Prng,
};
use ipu_isa::{AReg, CvtOp, FloatOp, FloatType, HredOp, ShufOp};

const F16_NAN: u16 = 0x7E00;
const F32_NAN: u32 = 0x7FC0_0000;

#[inline]
fn lane16(a: &[u32; 16], r: AReg, lane: usize) -> u16 {
    (a[r.first as usize + lane / 2] >> (16 * (lane % 2))) as u16
}

#[inline]
fn set_lane16(a: &mut [u32; 16], r: AReg, lane: usize, v: u16) {
    let reg = &mut a[r.first as usize + lane / 2];
    let sh = 16 * (lane % 2);
    *reg = (*reg & !(0xFFFF << sh)) | ((v as u32) << sh);
}

fn transcendental(op: FloatOp, x: f64) -> f64 {
    match op {
        FloatOp::Exp => x.exp(),
        FloatOp::Recip => 1.0 / x,
        FloatOp::Rsqrt => 1.0 / x.sqrt(),
        FloatOp::Tanh => x.tanh(),
        FloatOp::Sqrt => x.sqrt(),
        _ => unreachable!("not a transcendental operation"),
    }
}

fn f16_op(op: FloatOp, xb: u16, yb: u16, db: u16) -> u16 {
    let x = f16_bits_to_f32(xb) as f64;
    let y = f16_bits_to_f32(yb) as f64;
    match op {
        FloatOp::Add => f64_to_f16_bits(x + y),
        FloatOp::Sub => f64_to_f16_bits(x - y),
        FloatOp::Mul => f64_to_f16_bits(x * y),
        FloatOp::Mac => f64_to_f16_bits(f16_bits_to_f32(db) as f64 + x * y),
        FloatOp::Max | FloatOp::Min => {
            if x.is_nan() || y.is_nan() {
                F16_NAN
            } else if (op == FloatOp::Max && y > x) || (op == FloatOp::Min && y < x) {
                yb
            } else {
                xb
            }
        }
        FloatOp::CmpEq => {
            if x == y {
                0xFFFF
            } else {
                0
            }
        }
        FloatOp::CmpLt => {
            if x < y {
                0xFFFF
            } else {
                0
            }
        }
        FloatOp::CmpLe => {
            if x <= y {
                0xFFFF
            } else {
                0
            }
        }
        FloatOp::Abs => xb & 0x7FFF,
        FloatOp::Neg => xb ^ 0x8000,
        _ => f64_to_f16_bits(transcendental(op, x)),
    }
}

fn f32_op(op: FloatOp, xb: u32, yb: u32, db: u32) -> u32 {
    let x = f32::from_bits(xb);
    let y = f32::from_bits(yb);
    match op {
        FloatOp::Add => canonical_f32_bits(x + y),
        FloatOp::Sub => canonical_f32_bits(x - y),
        FloatOp::Mul => canonical_f32_bits(x * y),
        FloatOp::Mac => canonical_f32_bits(x.mul_add(y, f32::from_bits(db))),
        FloatOp::Max | FloatOp::Min => {
            if x.is_nan() || y.is_nan() {
                F32_NAN
            } else if (op == FloatOp::Max && y > x) || (op == FloatOp::Min && y < x) {
                yb
            } else {
                xb
            }
        }
        FloatOp::CmpEq => {
            if x == y {
                u32::MAX
            } else {
                0
            }
        }
        FloatOp::CmpLt => {
            if x < y {
                u32::MAX
            } else {
                0
            }
        }
        FloatOp::CmpLe => {
            if x <= y {
                u32::MAX
            } else {
                0
            }
        }
        FloatOp::Abs => xb & 0x7FFF_FFFF,
        FloatOp::Neg => xb ^ 0x8000_0000,
        _ => canonical_f32_bits(transcendental(op, x as f64) as f32),
    }
}

/// `f16v4*`, `f32v2*`, `f32*`.
pub(crate) fn float(a: &mut [u32; 16], ty: FloatType, op: FloatOp, d: AReg, x: AReg, y: AReg) {
    match ty {
        FloatType::F16v4 => {
            let mut out = [0u16; 4];
            for (l, o) in out.iter_mut().enumerate() {
                *o = f16_op(op, lane16(a, x, l), lane16(a, y, l), lane16(a, d, l));
            }
            for (l, o) in out.iter().enumerate() {
                set_lane16(a, d, l, *o);
            }
        }
        FloatType::F32v2 | FloatType::F32 => {
            let n = ty.width() as usize;
            let mut out = [0u32; 2];
            for (l, o) in out.iter_mut().enumerate().take(n) {
                *o = f32_op(
                    op,
                    a[x.first as usize + l],
                    a[y.first as usize + l],
                    a[d.first as usize + l],
                );
            }
            a[d.first as usize..d.first as usize + n].copy_from_slice(&out[..n]);
        }
    }
}

/// Horizontal reductions to one f32.
pub(crate) fn hred(a: &mut [u32; 16], op: HredOp, d: AReg, x: AReg) {
    let mut lanes = [0f64; 4];
    let n = match op {
        HredOp::F16v4Sum | HredOp::F16v4Max => {
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = f16_bits_to_f32(lane16(a, x, l)) as f64;
            }
            4
        }
        HredOp::F32v2Sum | HredOp::F32v2Max => {
            for (l, v) in lanes.iter_mut().enumerate().take(2) {
                *v = f32::from_bits(a[x.first as usize + l]) as f64;
            }
            2
        }
    };
    let lanes = &lanes[..n];
    let r = match op {
        HredOp::F16v4Sum | HredOp::F32v2Sum => lanes.iter().sum::<f64>() as f32,
        _ => {
            if lanes.iter().any(|v| v.is_nan()) {
                f32::NAN
            } else {
                lanes.iter().copied().fold(f64::NEG_INFINITY, f64::max) as f32
            }
        }
    };
    a[d.first as usize] = canonical_f32_bits(r);
}

/// Conversions; stochastic variants draw one PRNG value per lane.
pub(crate) fn cvt(a: &mut [u32; 16], prng: &mut Prng, op: CvtOp, d: AReg, x: AReg, scale: i8) {
    let s = scale as i32;
    match op {
        CvtOp::F32v2ToF16 | CvtOp::F32v2ToF16Sr => {
            let mut r = 0u32;
            for l in 0..2 {
                let v = f32::from_bits(a[x.first as usize + l]) as f64;
                let h = if op == CvtOp::F32v2ToF16Sr {
                    f64_to_f16_bits_sr(v, prng.next_unit())
                } else {
                    f64_to_f16_bits(v)
                };
                r |= (h as u32) << (16 * l);
            }
            a[d.first as usize] = r;
        }
        CvtOp::F32v4ToF16 => {
            // All four sources are read before the pair is written, so the
            // destination may overlap the quad.
            let h: [u16; 4] = std::array::from_fn(|l| {
                f64_to_f16_bits(f32::from_bits(a[x.first as usize + l]) as f64)
            });
            for (l, h) in h.into_iter().enumerate() {
                set_lane16(a, d, l, h);
            }
        }
        CvtOp::F16v2ToF32 => {
            let src = a[x.first as usize];
            a[d.first as usize] = f16_bits_to_f32(src as u16).to_bits();
            a[d.first as usize + 1] = f16_bits_to_f32((src >> 16) as u16).to_bits();
        }
        CvtOp::F16v4ToF8 | CvtOp::F16v4ToF8Sr => {
            let mut r = 0u32;
            for l in 0..4 {
                let v = f16_bits_to_f32(lane16(a, x, l)) as f64;
                let rnd = if op == CvtOp::F16v4ToF8Sr {
                    Some(prng.next_unit())
                } else {
                    None
                };
                r |= (f64_to_f8(v, s, rnd) as u32) << (8 * l);
            }
            a[d.first as usize] = r;
        }
        CvtOp::F8v4ToF16 => {
            let src = a[x.first as usize];
            for l in 0..4 {
                let v = f8_to_f64((src >> (8 * l)) as u8, s);
                set_lane16(a, d, l, f64_to_f16_bits(v));
            }
        }
        CvtOp::F32ToI32 => {
            let v = f32::from_bits(a[x.first as usize]);
            // `as` saturates and maps NaN to 0, after rounding half to even.
            a[d.first as usize] = (v.round_ties_even() as i32) as u32;
        }
        CvtOp::I32ToF32 => {
            a[d.first as usize] = (a[x.first as usize] as i32 as f32).to_bits();
        }
    }
}

/// Broadcasts, packing and float register moves.
pub(crate) fn shuf(a: &mut [u32; 16], op: ShufOp, d: AReg, x: AReg, y: AReg) {
    let d0 = d.first as usize;
    let xa = a[x.first as usize];
    let ya = a[y.first as usize];
    match op {
        ShufOp::F16v4Bcast => {
            let h = xa & 0xFFFF;
            a[d0] = h | (h << 16);
            a[d0 + 1] = h | (h << 16);
        }
        ShufOp::F32v2Bcast => {
            a[d0] = xa;
            a[d0 + 1] = xa;
        }
        ShufOp::Pack16Lo => a[d0] = (xa & 0xFFFF) | (ya << 16),
        ShufOp::Pack16Hi => a[d0] = (xa >> 16) | (ya & 0xFFFF_0000),
        ShufOp::Mov => a[d0] = xa,
        ShufOp::Mov64 => {
            let hi = a[x.first as usize + 1];
            a[d0] = xa;
            a[d0 + 1] = hi;
        }
    }
}
