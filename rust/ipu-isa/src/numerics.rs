//! Number formats of the ISA: f16 rounding, the fp8 F143 format with a
//! power-of-two scale, stochastic rounding and the per-context PRNG.
//!
//! These functions define the arithmetic of the conversion instructions; the
//! simulator calls them and host code (weight preparation, references) may
//! call them to produce bit-identical values.
//!
//! F143: 1 sign bit, 4 exponent bits (bias 8), 3 mantissa bits. Exponent
//! field 0 holds subnormals (m * 2^-10); fields 1..15 hold (1 + m/8) *
//! 2^(e-8), so the largest magnitude is 240. There are no infinities; the
//! byte 0x80 (negative zero) is the only NaN. Conversions to F143 saturate to
//! +-240 and map NaN to 0x80; -0 becomes +0.

/// Largest finite F143 magnitude.
pub const F8_MAX: f64 = 240.0;
/// The F143 NaN byte.
pub const F8_NAN: u8 = 0x80;

/// Rounds an f64 to the nearest even f16 and returns its bits. Values at or
/// beyond the overflow threshold become infinities; every NaN becomes the
/// canonical 0x7E00 (hosts differ in the sign of generated NaNs).
#[inline]
pub fn f64_to_f16_bits(x: f64) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 48) & 0x8000) as u16;
    let exp = ((b >> 52) & 0x7FF) as i32;
    let man = b & ((1u64 << 52) - 1);
    if exp == 0x7FF {
        // NaN results are the canonical quiet NaN, whatever the host's NaN sign.
        return if man != 0 { 0x7E00 } else { sign | 0x7C00 };
    }
    if exp == 0 {
        // f64 subnormals are far below half the smallest f16 subnormal.
        return sign;
    }
    let e = exp - 1023;
    if (-14..=15).contains(&e) {
        // Normal results: round the f64 significand to 10 fraction bits, ties
        // to even, directly on the magnitude bits; a carry moves into the
        // exponent, and past 2^15 the result overflows to infinity.
        let mag = b & 0x7FFF_FFFF_FFFF_FFFF;
        let r = mag + (1u64 << 41) - 1 + ((mag >> 42) & 1);
        let re = (r >> 52) as i32 - 1023;
        if re > 15 {
            return sign | 0x7C00;
        }
        return sign | (((re + 15) as u16) << 10) | ((r >> 42) & 0x3FF) as u16;
    }
    if e > 15 {
        return sign | 0x7C00;
    }
    let sig = man | (1u64 << 52);
    // Keep 10 fraction bits for normals; subnormals lose one more bit per
    // binade below 2^-14.
    let shift = if e >= -14 {
        42u32
    } else {
        (42 + (-14 - e)) as u32
    };
    if shift > 63 {
        return sign;
    }
    let kept = sig >> shift;
    let rem = sig & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    let rounded = kept + (rem > half || (rem == half && kept & 1 == 1)) as u64;
    let bits = if e >= -14 {
        // rounded carries its implicit bit at position 10; a carry out of the
        // fraction moves into the exponent, and past 30 it becomes infinity.
        (((e + 15) as u64) << 10) + rounded - (1 << 10)
    } else {
        rounded
    };
    sign | bits.min(0x7C00) as u16
}

/// The canonical f32 NaN produced by every float instruction.
pub const F32_CANONICAL_NAN: u32 = 0x7FC0_0000;

/// f32 bits with any NaN replaced by the canonical NaN, so that results do
/// not depend on the host's NaN sign or payload rules.
#[inline]
pub fn canonical_f32_bits(x: f32) -> u32 {
    if x.is_nan() {
        F32_CANONICAL_NAN
    } else {
        x.to_bits()
    }
}

/// Rounds an f32 to the nearest even f16 bits.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    f64_to_f16_bits(x as f64)
}

/// f32 bits of f16 bits, exact; usable in constants.
pub const fn f16_bits_to_f32_bits(h: u16) -> u32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let man = (h & 0x3FF) as u32;
    if exp == 0x1F {
        return sign | 0x7F80_0000 | (man << 13);
    }
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // Subnormal: normalise the mantissa.
        let mut e: u32 = 127 - 15 + 1;
        let mut m = man;
        while m & 0x400 == 0 {
            m <<= 1;
            e -= 1;
        }
        return sign | (e << 23) | ((m & 0x3FF) << 13);
    }
    sign | ((exp + 127 - 15) << 23) | (man << 13)
}

const fn build_f16_table() -> [u32; 65536] {
    let mut t = [0u32; 65536];
    let mut i = 0;
    while i < 65536 {
        t[i] = f16_bits_to_f32_bits(i as u16);
        i += 1;
    }
    t
}

/// f32 bits of every f16, built at compile time so that lookups cost one load.
static F16_TABLE: [u32; 65536] = build_f16_table();

/// The f32 value of f16 bits (exact).
#[inline]
pub fn f16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(F16_TABLE[b as usize])
}

/// Rounds `x` to the nearest even f16 value and returns it as an f64: the
/// same value as `f16_bits_to_f32(f64_to_f16_bits(x))`, with a fast path for
/// results in the normal f16 range.
#[inline]
pub fn round_f64_to_f16_value(x: f64) -> f64 {
    if x == 0.0 {
        return x;
    }
    let b = x.to_bits();
    let exp = ((b >> 52) & 0x7FF) as i32 - 1023;
    if (-14..=15).contains(&exp) {
        // Round the f64 significand to 10 fraction bits, ties to even; a carry
        // moves into the exponent, which is the correct result.
        let lsb = (b >> 42) & 1;
        let r = (b + (1u64 << 41) - 1 + lsb) & !((1u64 << 42) - 1);
        let v = f64::from_bits(r);
        if v.abs() < 65536.0 {
            return v;
        }
    }
    f16_bits_to_f32(f64_to_f16_bits(x)) as f64
}

/// f32 bits of an F143 byte (without scale); usable in constants.
pub const fn f8_to_f32_bits(b: u8) -> u32 {
    if b == F8_NAN {
        return 0x7FC0_0000;
    }
    let sign = ((b as u32) & 0x80) << 24;
    let e = ((b >> 3) & 15) as u32;
    let m = (b & 7) as u32;
    if e == 0 {
        if m == 0 {
            return sign;
        }
        // m * 2^-10 with m in 1..7: normalise.
        let mut exp: u32 = 127 - 10 + 2;
        let mut mm = m;
        while mm & 4 == 0 {
            mm <<= 1;
            exp -= 1;
        }
        return sign | (exp << 23) | ((mm & 3) << 21);
    }
    sign | ((e + 127 - 8) << 23) | (m << 20)
}

const fn build_f8_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = f8_to_f32_bits(i as u8);
        i += 1;
    }
    t
}

static F8_TABLE: [u32; 256] = build_f8_table();

#[cfg(test)]
fn f8_decode_slow(b: u8) -> f64 {
    if b == F8_NAN {
        return f64::NAN;
    }
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 15) as i32;
    let m = (b & 7) as f64;
    let mag = if e == 0 {
        m * 2f64.powi(-10)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 8)
    };
    sign * mag
}

/// The value of an F143 byte (without scale).
#[inline]
pub fn f8_to_f32(b: u8) -> f32 {
    f32::from_bits(F8_TABLE[b as usize])
}

/// Quantises |y| (finite, non-negative) onto a binary grid with `mbits`
/// fraction bits and smallest normal exponent `emin`, rounding to nearest
/// even, or up with probability equal to the remainder when `random` is
/// given (a uniform value in [0, 1)).
fn quantize(y: f64, mbits: i32, emin: i32, random: Option<f64>) -> f64 {
    if y == 0.0 {
        return 0.0;
    }
    let e = (y.log2().floor() as i32).max(emin);
    // log2 may be off by one near powers of two; fix it exactly.
    let e = if e > emin && 2f64.powi(e) > y {
        e - 1
    } else if 2f64.powi(e + 1) <= y {
        e + 1
    } else {
        e
    };
    let ulp = 2f64.powi(e - mbits);
    let units = y / ulp;
    let q = match random {
        None => units.round_ties_even(),
        Some(r) => (units + r).floor(),
    };
    q * ulp
}

/// Converts to F143 as `round(x * 2^-scale)`: nearest-even when `random` is
/// `None`, stochastic otherwise.
pub fn f64_to_f8(x: f64, scale: i32, random: Option<f64>) -> u8 {
    if x.is_nan() {
        return F8_NAN;
    }
    let y = x * 2f64.powi(-scale);
    let neg = y < 0.0;
    let q = if y.is_infinite() {
        F8_MAX
    } else {
        quantize(y.abs(), 3, -7, random).min(F8_MAX)
    };
    if q == 0.0 {
        return 0;
    }
    let bits = if q < 2f64.powi(-7) {
        (q / 2f64.powi(-10)) as u8
    } else {
        let e = q.log2().floor() as i32;
        let e = if 2f64.powi(e) > q { e - 1 } else { e };
        let m = ((q / 2f64.powi(e) - 1.0) * 8.0) as u8;
        (((e + 8) as u8) << 3) | m
    };
    bits | if neg { 0x80 } else { 0 }
}

/// Value of an F143 byte times 2^scale.
pub fn f8_to_f64(b: u8, scale: i32) -> f64 {
    f8_to_f32(b) as f64 * 2f64.powi(scale)
}

/// Rounds to f16 stochastically: up with probability equal to the distance
/// from the lower neighbour in units of the f16 spacing. Overflow past the
/// largest finite f16 gives infinity.
pub fn f64_to_f16_bits_sr(x: f64, random: f64) -> u16 {
    if !x.is_finite() {
        return f64_to_f16_bits(x);
    }
    let q = quantize(x.abs(), 10, -14, Some(random));
    let bits = f64_to_f16_bits(q);
    bits | if x < 0.0 { 0x8000 } else { 0 }
}

/// The per-context pseudo-random generator behind stochastic rounding:
/// xorshift64* with a non-zero state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prng(pub u64);

impl Prng {
    /// The constant used when a zero seed is requested (xorshift needs a non-zero state).
    pub const ZERO_SEED_REPLACEMENT: u64 = 0x9E37_79B9_7F4A_7C15;

    pub fn new(seed: u64) -> Prng {
        Prng(if seed == 0 {
            Self::ZERO_SEED_REPLACEMENT
        } else {
            seed
        })
    }

    /// The reset state of context `context` (0..5 workers, 6 supervisor) of tile `tile`.
    pub fn for_context(tile: u32, context: u32) -> Prng {
        // splitmix64 of the pair gives well-spread distinct seeds.
        let mut z = ((tile as u64) << 8 | context as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Prng::new(z ^ (z >> 31))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A uniform value in [0, 1) with 53 random bits.
    pub fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounding_matches_half_crate_on_f32_inputs() {
        // half's f32 -> f16 conversion rounds to nearest even; compare over a
        // deterministic sweep of f32 bit patterns, including subnormals and overflow.
        let mut s = 0x1234_5678u32;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(s);
            if x.is_nan() {
                continue;
            }
            assert_eq!(
                f32_to_f16_bits(x),
                half::f16::from_f32(x).to_bits(),
                "{x:e}"
            );
        }
        for x in [
            65504.0f32,
            65519.0,
            65520.0,
            6.0e-8,
            2.98e-8,
            2.9802322e-8,
            1.0 + 1.0 / 2048.0,
        ] {
            assert_eq!(
                f32_to_f16_bits(x),
                half::f16::from_f32(x).to_bits(),
                "{x:e}"
            );
        }
    }

    #[test]
    fn const_table_and_fast_rounding_agree_with_half() {
        for b in 0..=u16::MAX {
            let h = half::f16::from_bits(b);
            if h.is_nan() {
                assert!(f16_bits_to_f32(b).is_nan());
                continue;
            }
            assert_eq!(f16_bits_to_f32(b), h.to_f32(), "{b:#x}");
        }
        let mut s = 0x9876_5431u64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Spread magnitudes over the f16 range and beyond.
            let x = f64::from_bits(s).clamp(-1e6, 1e6);
            let x = if x.is_nan() { 0.5 } else { x };
            let slow = f16_bits_to_f32(f64_to_f16_bits(x)) as f64;
            let fast = round_f64_to_f16_value(x);
            assert!(
                slow == fast || (slow.is_nan() && fast.is_nan()),
                "{x:e}: {slow} vs {fast}"
            );
            let y = ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 4096.0;
            assert_eq!(
                f16_bits_to_f32(f64_to_f16_bits(y)) as f64,
                round_f64_to_f16_value(y),
                "{y:e}"
            );
        }
    }

    /// Nearest-even f16 by comparing the neighbours of a candidate in f64:
    /// an independent reference for f64 inputs (the `half` crate converts
    /// f64 through f32 and so double-rounds some values).
    fn reference_f16(x: f64) -> u16 {
        if x.abs() >= 65520.0 {
            return if x > 0.0 { 0x7C00 } else { 0xFC00 };
        }
        let c = half::f16::from_f64(x).to_bits();
        let mut best = (f64::INFINITY, c);
        for cand in [c.wrapping_sub(1), c, c.wrapping_add(1)] {
            let v = half::f16::from_bits(cand);
            if v.is_nan() || (cand ^ c) & 0x8000 != 0 {
                continue;
            }
            let d = (v.to_f64() - x).abs();
            if d < best.0 || (d == best.0 && cand & 1 == 0) {
                best = (d, cand);
            }
        }
        best.1
    }

    #[test]
    fn f16_rounding_of_f64_inputs_is_correct() {
        let mut s = 0x5555_1234_9876_abcdu64;
        for i in 0..300_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Values near f16 ties with bits far below the f32 precision.
            let base = ((s % 4096) as f64 - 2048.0) * 2f64.powi((s >> 12) as i32 % 40 - 30);
            let x = if i % 2 == 0 {
                base
            } else {
                base + base * 2f64.powi(-11) + base * 2f64.powi(-40)
            };
            let got = f64_to_f16_bits(x);
            let want = reference_f16(x);
            assert!(
                got == want || (x == 0.0 && got & 0x7FFF == 0),
                "{x:e}: {got:#x} vs {want:#x}"
            );
        }
        // The double-rounding case: 1 + 2^-11 + 2^-40 rounds up.
        assert_eq!(
            f64_to_f16_bits(1.0 + 2f64.powi(-11) + 2f64.powi(-40)),
            0x3C01
        );
    }

    #[test]
    fn f8_table_matches_the_definition() {
        for b in 0..=255u8 {
            let (t, d) = (f8_to_f32(b) as f64, f8_decode_slow(b));
            assert!(t == d || (t.is_nan() && d.is_nan()), "{b:#x}: {t} vs {d}");
        }
    }

    #[test]
    fn f8_round_trip_and_saturation() {
        for b in 0..=255u8 {
            if b == F8_NAN {
                continue;
            }
            let v = f8_to_f64(b, 0);
            let back = f64_to_f8(v, 0, None);
            // -0.0 encodes as +0.
            let expect = if v == 0.0 { 0 } else { b };
            assert_eq!(back, expect, "byte {b:#x} value {v}");
        }
        assert_eq!(f8_to_f64(0x7F, 0), 240.0);
        assert_eq!(f64_to_f8(1e9, 0, None), 0x7F);
        assert_eq!(f64_to_f8(-1e9, 0, None), 0xFF);
        assert_eq!(f64_to_f8(f64::NAN, 0, None), F8_NAN);
        // Scale: 3.0 * 2^-2 = 0.75 exactly representable.
        assert_eq!(f8_to_f64(f64_to_f8(3.0, 2, None), 2), 3.0);
        // Tie: 1 + 1/16 is halfway between 1 and 1.125: even mantissa (1.0) wins.
        assert_eq!(f8_to_f64(f64_to_f8(1.0625, 0, None), 0), 1.0);
        assert_eq!(f8_to_f64(f64_to_f8(1.1875, 0, None), 0), 1.25);
    }

    #[test]
    fn stochastic_rounding_is_unbiased_and_deterministic() {
        let mut p = Prng::new(42);
        let x = 1.0 + 0.25 / 1024.0; // a quarter of an f16 ulp above 1.0
        let n = 20_000;
        let ups = (0..n)
            .filter(|_| f64_to_f16_bits_sr(x, p.next_unit()) != 0x3C00)
            .count();
        let frac = ups as f64 / n as f64;
        assert!((frac - 0.25).abs() < 0.02, "{frac}");
        let mut a = Prng::for_context(3, 1);
        let mut b = Prng::for_context(3, 1);
        assert_eq!(a.next_u64(), b.next_u64());
        assert_ne!(Prng::for_context(3, 1), Prng::for_context(3, 2));
    }
}
