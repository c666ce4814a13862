//! F143 fp8: 1 sign bit, 4 exponent bits (bias 8), 3 mantissa bits.
//!
//! Encodings: exponent 0 is subnormal (`m/8 * 2^-7`); every other exponent is
//! normal (`(1 + m/8) * 2^(e-8)`), including 15, so the largest finite value is
//! `1.875 * 2^7 = 240`. There are no infinities and no negative zero: `0x80`
//! is the only NaN. A tensor's dtype adds a power-of-two scale: code `c`
//! stands for `decode(c) * 2^scale_log2`.
//!
//! Rounding (the rule device kernels must match): round to nearest, ties to
//! the even code; magnitudes beyond 240 saturate to +-240 rather than become
//! NaN, because a saturated activation is far more useful than a poisoned one;
//! NaN encodes as `0x80`; results that round to zero encode as `0x00`.

/// The NaN code.
pub const NAN_CODE: u8 = 0x80;
/// The largest finite magnitude (before scaling).
pub const MAX: f64 = 240.0;

/// The unscaled value of a code.
pub fn decode(code: u8) -> f64 {
    if code == NAN_CODE {
        return f64::NAN;
    }
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = ((code >> 3) & 0xF) as i32;
    let mantissa = (code & 7) as f64;
    let magnitude = if exponent == 0 {
        mantissa / 8.0 * 2f64.powi(1 - 8)
    } else {
        (1.0 + mantissa / 8.0) * 2f64.powi(exponent - 8)
    };
    sign * magnitude
}

/// The scaled value of a code.
pub fn decode_scaled(code: u8, scale_log2: i8) -> f64 {
    decode(code) * 2f64.powi(scale_log2 as i32)
}

/// The code nearest to `x` (unscaled), by the rounding rule above.
pub fn encode(x: f64) -> u8 {
    if x.is_nan() {
        return NAN_CODE;
    }
    let sign: u8 = if x < 0.0 { 0x80 } else { 0 };
    let a = x.abs();
    if a >= MAX {
        return sign | 0x7F;
    }
    // Positive codes 0x00..=0x7F decode to increasing values, so find the
    // first code whose value is >= a and choose between it and its predecessor.
    let mut hi = 0u8;
    while decode(hi) < a {
        hi += 1;
    }
    let code = if hi == 0 {
        0
    } else {
        let lo = hi - 1;
        let (dlo, dhi) = (a - decode(lo), decode(hi) - a);
        if dlo < dhi || (dlo == dhi && lo.is_multiple_of(2)) {
            lo
        } else {
            hi
        }
    };
    if code == 0 {
        0
    } else {
        sign | code
    }
}

/// The code for `x` in a tensor with scale `2^scale_log2`.
pub fn encode_scaled(x: f64, scale_log2: i8) -> u8 {
    encode(x * 2f64.powi(-(scale_log2 as i32)))
}

/// `x` rounded to the nearest scaled F143 value.
pub fn round(x: f64, scale_log2: i8) -> f64 {
    decode_scaled(encode_scaled(x, scale_log2), scale_log2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn landmarks() {
        assert_eq!(decode(0x00), 0.0);
        assert_eq!(decode(0x01), 2f64.powi(-10));
        assert_eq!(decode(0x08), 2f64.powi(-7));
        assert_eq!(decode(0x40), 1.0);
        assert_eq!(decode(0x7F), 240.0);
        assert_eq!(decode(0xC0), -1.0);
        assert!(decode(NAN_CODE).is_nan());
    }

    #[test]
    fn every_code_round_trips() {
        for code in 0..=255u8 {
            if code == NAN_CODE {
                continue;
            }
            assert_eq!(encode(decode(code)), code, "code {code:#04x}");
        }
    }

    #[test]
    fn rounding_is_nearest_even_and_saturating() {
        // 1.0 = 0x40, next is 1.125 = 0x41: the midpoint rounds to the even 0x40.
        assert_eq!(encode(1.0625), 0x40);
        // 1.125 = 0x41 and 1.25 = 0x42: the midpoint goes to 0x42.
        assert_eq!(encode(1.1875), 0x42);
        assert_eq!(encode(1.05), 0x40);
        assert_eq!(encode(1.07), 0x41);
        assert_eq!(encode(1e6), 0x7F);
        assert_eq!(encode(-1e6), 0xFF);
        assert_eq!(encode(2f64.powi(-12)), 0x00);
        assert_eq!(encode(-2f64.powi(-12)), 0x00);
        assert_eq!(encode(f64::NAN), NAN_CODE);
        assert_eq!(round(3.0, -2), 3.0);
        assert_eq!(round(100.0, -2), 60.0);
        assert_eq!(encode_scaled(0.25, -2), 0x40);
    }
}
