//! Host tensors: a dtype, a shape and values held as f64.
//!
//! Invariant: every element is exactly representable in the dtype (the
//! constructors round), so converting to device storage and back is lossless.

use std::fmt;

use ipu_graph::{DType, Shape, TensorType};

use crate::fp8;

/// A dense row-major tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    data: Vec<f64>,
}

/// Why a tensor could not be built.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorError {
    /// The element count does not match the shape.
    Length {
        /// The type.
        ty: TensorType,
        /// Elements given.
        found: usize,
    },
    /// The byte count does not match the shape and dtype.
    Bytes {
        /// The type.
        ty: TensorType,
        /// Bytes given.
        found: usize,
    },
}

impl fmt::Display for TensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorError::Length { ty, found } => {
                write!(
                    f,
                    "a {ty} tensor has {} elements, found {found}",
                    ty.shape.elements()
                )
            }
            TensorError::Bytes { ty, found } => {
                write!(f, "a {ty} tensor has {} bytes, found {found}", ty.bytes())
            }
        }
    }
}

impl std::error::Error for TensorError {}

/// `x` rounded to the nearest value of `dtype` (ties to even). f16 and f32
/// overflow to infinity as IEEE conversion does; fp8 saturates (see [`fp8`]).
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::Fp8 { scale_log2 } => fp8::round(x, scale_log2),
    }
}

/// The unit roundoff of a dtype: half the distance from 1 to the next value.
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::Fp8 { .. } => 2f64.powi(-4),
    }
}

impl Tensor {
    /// A tensor of `dtype` and `shape` from values, each rounded to the dtype.
    pub fn new(dtype: DType, shape: Shape, data: Vec<f64>) -> Result<Tensor, TensorError> {
        if data.len() as u64 != shape.elements() {
            return Err(TensorError::Length {
                ty: TensorType { dtype, shape },
                found: data.len(),
            });
        }
        let data = data.into_iter().map(|x| round_to(dtype, x)).collect();
        Ok(Tensor { dtype, shape, data })
    }

    /// A tensor with every element `value` (rounded to the dtype).
    pub fn filled(ty: &TensorType, value: f64) -> Tensor {
        Tensor {
            dtype: ty.dtype,
            shape: ty.shape.clone(),
            data: vec![round_to(ty.dtype, value); ty.shape.elements() as usize],
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Type (dtype and shape).
    pub fn ty(&self) -> TensorType {
        TensorType {
            dtype: self.dtype,
            shape: self.shape.clone(),
        }
    }

    /// The values in row-major order.
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// The element at a full index.
    pub fn get(&self, index: &[usize]) -> f64 {
        let offset: usize = index
            .iter()
            .zip(self.shape.strides())
            .map(|(i, s)| i * s)
            .sum();
        self.data[offset]
    }

    /// The same values converted to another dtype (rounding).
    pub fn cast(&self, dtype: DType) -> Tensor {
        Tensor {
            dtype,
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| round_to(dtype, x)).collect(),
        }
    }

    /// Device storage bytes, little-endian: f32 and f16 IEEE bits, fp8 codes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() * self.dtype.size_bytes());
        for &x in &self.data {
            match self.dtype {
                DType::F32 => out.extend((x as f32).to_le_bytes()),
                DType::F16 => out.extend(half::f16::from_f64(x).to_le_bytes()),
                DType::Fp8 { scale_log2 } => out.push(fp8::encode_scaled(x, scale_log2)),
            }
        }
        out
    }

    /// A tensor from device storage bytes (the inverse of [`Tensor::to_bytes`]).
    pub fn from_bytes(ty: &TensorType, bytes: &[u8]) -> Result<Tensor, TensorError> {
        if bytes.len() as u64 != ty.bytes() {
            return Err(TensorError::Bytes {
                ty: ty.clone(),
                found: bytes.len(),
            });
        }
        let data = match ty.dtype {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::Fp8 { scale_log2 } => bytes
                .iter()
                .map(|&c| fp8::decode_scaled(c, scale_log2))
                .collect(),
        };
        Ok(Tensor {
            dtype: ty.dtype,
            shape: ty.shape.clone(),
            data,
        })
    }

    /// The values as f32 (exact for f16, f32 and fp8 tensors).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.data.iter().map(|&x| x as f32).collect()
    }

    /// The values as f16 (rounding when the dtype is f32).
    pub fn to_f16_vec(&self) -> Vec<half::f16> {
        self.data.iter().map(|&x| half::f16::from_f64(x)).collect()
    }

    /// An f32 tensor from f32 values.
    pub fn from_f32(shape: Shape, data: &[f32]) -> Result<Tensor, TensorError> {
        Tensor::new(DType::F32, shape, data.iter().map(|&x| x as f64).collect())
    }

    /// An f16 tensor from f16 values.
    pub fn from_f16(shape: Shape, data: &[half::f16]) -> Result<Tensor, TensorError> {
        Tensor::new(DType::F16, shape, data.iter().map(|x| x.to_f64()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_for_every_dtype() {
        for dtype in [DType::F32, DType::F16, DType::Fp8 { scale_log2: -3 }] {
            let t = Tensor::new(
                dtype,
                Shape::new([2, 3]),
                vec![0.1, -2.5, 3.75, 1e-3, 7.0, -0.0],
            )
            .unwrap();
            let bytes = t.to_bytes();
            assert_eq!(bytes.len(), 6 * dtype.size_bytes());
            assert_eq!(Tensor::from_bytes(&t.ty(), &bytes).unwrap(), t, "{dtype}");
        }
    }

    #[test]
    fn constructors_round_to_the_dtype() {
        let t = Tensor::new(DType::F16, Shape::new([1]), vec![1.0 / 1152.0]).unwrap();
        assert_eq!(t.data()[0], 0.000_867_843_627_929_687_5);
        assert_eq!(
            round_to(DType::F16, 1.0 - 2f64.powi(-12)),
            1.0,
            "a tie rounds to the even 1.0"
        );
        assert_eq!(round_to(DType::F32, 0.1), 0.1f32 as f64);
        assert!(Tensor::new(DType::F16, Shape::new([2]), vec![1.0]).is_err());
    }
}
