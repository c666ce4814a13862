//! Element types, shapes and tensor types.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
///
/// `Fp8` is Graphcore's F143 format (1 sign bit, 4 exponent bits with bias 8,
/// 3 mantissa bits, no infinities, `0x80` is NaN) together with a power-of-two
/// scale: a stored code `c` represents the real value `decode(c) * 2^scale_log2`.
/// The scale is part of the type so that two fp8 tensors with different scales
/// are different types, as they are on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// F143 with a power-of-two scale.
    Fp8 {
        /// The base-two logarithm of the scale applied to every code.
        scale_log2: i8,
    },
}

impl DType {
    /// Bytes one element occupies in device memory and in host buffers.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
            DType::Fp8 { .. } => 1,
        }
    }

    /// Whether this is an fp8 type (of any scale).
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::Fp8 { .. })
    }

    /// Whether this type can hold the result of arithmetic other than a GEMM
    /// operand: elementwise operations, normalisations and attention work in f16
    /// or f32 only, because fp8 has too little precision for them.
    pub fn is_arithmetic(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DType::F32 => f.write_str("f32"),
            DType::F16 => f.write_str("f16"),
            DType::Fp8 { scale_log2: 0 } => f.write_str("fp8"),
            DType::Fp8 { scale_log2 } => write!(f, "fp8<{scale_log2}>"),
        }
    }
}

/// Why a string is not a dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DTypeParseError(pub String);

impl fmt::Display for DTypeParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown dtype `{}` (expected f32, f16, fp8 or fp8<scale> with an integer scale from -128 to 127)",
            self.0
        )
    }
}

impl std::error::Error for DTypeParseError {}

impl FromStr for DType {
    type Err = DTypeParseError;

    /// Parses the same spelling that `Display` prints: `f32`, `f16`, `fp8`, `fp8<-3>`.
    fn from_str(s: &str) -> Result<DType, DTypeParseError> {
        let err = || DTypeParseError(s.to_string());
        match s {
            "f32" => Ok(DType::F32),
            "f16" => Ok(DType::F16),
            "fp8" => Ok(DType::Fp8 { scale_log2: 0 }),
            _ => {
                let inner = s
                    .strip_prefix("fp8<")
                    .and_then(|r| r.strip_suffix('>'))
                    .ok_or_else(err)?;
                let scale_log2 = inner.trim().parse::<i8>().map_err(|_| err())?;
                Ok(DType::Fp8 { scale_log2 })
            }
        }
    }
}

impl serde::Serialize for DType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<DType, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The dimensions of a tensor, outermost first. Every dimension is at least 1;
/// a rank-0 shape `[]` is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar).
    pub fn elements(&self) -> u64 {
        self.0.iter().map(|&d| d as u64).product()
    }

    /// The innermost dimension, if any.
    pub fn last(&self) -> Option<usize> {
        self.0.last().copied()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of a value: element type and shape, printed as `f16[729, 1152]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type from an element type and dimensions.
    pub fn new(dtype: DType, dims: impl Into<Vec<usize>>) -> TensorType {
        TensorType {
            dtype,
            shape: Shape::new(dims),
        }
    }

    /// Bytes the tensor occupies densely packed.
    pub fn bytes(&self) -> u64 {
        self.shape.elements() * self.dtype.size_bytes() as u64
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// Broadcasts two shapes by numpy's rule: align the trailing dimensions; each
/// pair must be equal or contain a 1; missing leading dimensions count as 1.
/// Returns `None` when the shapes are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() {
            1
        } else {
            a[i - (rank - a.len())]
        };
        let db = if i < rank - b.len() {
            1
        } else {
            b[i - (rank - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_spellings_round_trip() {
        for d in [
            DType::F32,
            DType::F16,
            DType::Fp8 { scale_log2: 0 },
            DType::Fp8 { scale_log2: -3 },
            DType::Fp8 { scale_log2: 7 },
        ] {
            assert_eq!(d.to_string().parse::<DType>(), Ok(d));
        }
        assert!("bf16".parse::<DType>().is_err());
        assert!("fp8<x>".parse::<DType>().is_err());
        assert!("fp8<300>".parse::<DType>().is_err());
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shapes(&[729, 1152], &[1152]),
            Some(vec![729, 1152])
        );
        assert_eq!(broadcast_shapes(&[4, 1, 3], &[5, 1]), Some(vec![4, 5, 3]));
        assert_eq!(broadcast_shapes(&[2, 3], &[]), Some(vec![2, 3]));
        assert_eq!(broadcast_shapes(&[2, 3], &[2]), None);
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(Shape::new([2, 3, 4]).strides(), vec![12, 4, 1]);
        assert_eq!(Shape::new([]).strides(), Vec::<usize>::new());
        assert_eq!(Shape::new([2, 3, 4]).elements(), 24);
    }
}
