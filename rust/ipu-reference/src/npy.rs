//! NumPy `.npy` files, format versions 1.0, 2.0 and 3.0, little-endian.
//!
//! Supported element types: `<f2`, `<f4`, `<f8` and `|u1` (also spelled
//! `<u1`), which holds fp8 F143 codes; the fp8 scale is not in the file but in
//! the model, so reading `|u1` needs the tensor type it is for. Fortran order,
//! big-endian data and every other type are refused with an error naming what
//! was found.

use std::fmt;

use ipu_graph::{DType, Shape, TensorType};

use crate::fp8;
use crate::tensor::Tensor;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The element type recorded in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyDtype {
    /// `<f2`.
    F2,
    /// `<f4`.
    F4,
    /// `<f8`.
    F8,
    /// `|u1`: fp8 codes.
    U1,
}

impl NpyDtype {
    fn descr(self) -> &'static str {
        match self {
            NpyDtype::F2 => "<f2",
            NpyDtype::F4 => "<f4",
            NpyDtype::F8 => "<f8",
            NpyDtype::U1 => "|u1",
        }
    }

    fn size(self) -> usize {
        match self {
            NpyDtype::F2 => 2,
            NpyDtype::F4 => 4,
            NpyDtype::F8 => 8,
            NpyDtype::U1 => 1,
        }
    }
}

/// Why a file is not a usable `.npy`.
#[derive(Clone, Debug, PartialEq)]
pub enum NpyError {
    /// The first six bytes are not `\x93NUMPY`.
    BadMagic,
    /// The file ends before the header does.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        found: usize,
    },
    /// A format version other than 1.0, 2.0 or 3.0.
    UnsupportedVersion(u8, u8),
    /// The header dictionary cannot be read.
    BadHeader(String),
    /// An element type this reader does not handle.
    UnsupportedDtype(String),
    /// Column-major data.
    FortranOrder,
    /// The data length does not match the header's shape.
    DataLength {
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes present.
        found: usize,
    },
    /// The file's shape differs from the type it is read for.
    ShapeMismatch {
        /// The type wanted.
        expected: TensorType,
        /// The shape in the file.
        found: Shape,
    },
    /// `|u1` data read for a non-fp8 tensor, or the reverse.
    DtypeMismatch {
        /// The type wanted.
        expected: TensorType,
        /// The descr in the file.
        found: &'static str,
    },
}

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NpyError::BadMagic => write!(f, "not a .npy file (the magic string \\x93NUMPY is missing)"),
            NpyError::Truncated { needed, found } => {
                write!(f, "truncated .npy header: needs {needed} bytes, the file has {found}")
            }
            NpyError::UnsupportedVersion(a, b) => {
                write!(f, "unsupported .npy format version {a}.{b} (supported: 1.0, 2.0, 3.0)")
            }
            NpyError::BadHeader(why) => write!(f, "unreadable .npy header: {why}"),
            NpyError::UnsupportedDtype(d) => write!(
                f,
                "unsupported .npy dtype '{d}' (supported: '<f2', '<f4', '<f8', '|u1'; data must be little-endian)"
            ),
            NpyError::FortranOrder => write!(f, "Fortran-order .npy data is not supported; save a C-order array"),
            NpyError::DataLength { expected, found } => {
                write!(f, ".npy data has {found} bytes but the header's shape needs {expected}")
            }
            NpyError::ShapeMismatch { expected, found } => {
                write!(f, ".npy shape {found} differs from the expected type {expected}")
            }
            NpyError::DtypeMismatch { expected, found } => write!(
                f,
                ".npy dtype '{found}' cannot hold {expected} (fp8 tensors are stored as '|u1' codes and only they are)"
            ),
        }
    }
}

impl std::error::Error for NpyError {}

/// The contents of a `.npy` file.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray {
    /// Element type.
    pub dtype: NpyDtype,
    /// Shape (C order).
    pub shape: Shape,
    /// Raw little-endian element bytes.
    pub data: Vec<u8>,
}

impl NpyArray {
    /// The elements as f64 (fp8 codes are returned as their code numbers).
    pub fn values(&self) -> Vec<f64> {
        match self.dtype {
            NpyDtype::F2 => self
                .data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            NpyDtype::F4 => self
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            NpyDtype::F8 => self
                .data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8")))
                .collect(),
            NpyDtype::U1 => self.data.iter().map(|&c| c as f64).collect(),
        }
    }

    /// Converts to a tensor of type `ty`. Float data of any width is rounded to
    /// `ty`'s dtype (so an f64 reference can be read as f16); `|u1` data is
    /// taken as fp8 codes and needs an fp8 `ty`, whose scale applies.
    pub fn to_tensor(&self, ty: &TensorType) -> Result<Tensor, NpyError> {
        if self.shape != ty.shape {
            return Err(NpyError::ShapeMismatch {
                expected: ty.clone(),
                found: self.shape.clone(),
            });
        }
        match (self.dtype, ty.dtype) {
            (NpyDtype::U1, DType::Fp8 { scale_log2 }) => {
                let data = self
                    .data
                    .iter()
                    .map(|&c| fp8::decode_scaled(c, scale_log2))
                    .collect();
                Ok(Tensor::new(ty.dtype, ty.shape.clone(), data).expect("length checked by parse"))
            }
            (NpyDtype::U1, _) | (_, DType::Fp8 { .. }) => Err(NpyError::DtypeMismatch {
                expected: ty.clone(),
                found: self.dtype.descr(),
            }),
            _ => Ok(Tensor::new(ty.dtype, ty.shape.clone(), self.values())
                .expect("length checked by parse")),
        }
    }
}

/// Parses a `.npy` file.
pub fn parse(bytes: &[u8]) -> Result<NpyArray, NpyError> {
    if bytes.len() < 8 {
        if !MAGIC.starts_with(&bytes[..bytes.len().min(6)]) {
            return Err(NpyError::BadMagic);
        }
        return Err(NpyError::Truncated {
            needed: 10,
            found: bytes.len(),
        });
    }
    if &bytes[..6] != MAGIC {
        return Err(NpyError::BadMagic);
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len_bytes, header_start) = match (major, minor) {
        (1, 0) => (2, 10),
        (2, 0) | (3, 0) => (4, 12),
        _ => return Err(NpyError::UnsupportedVersion(major, minor)),
    };
    if bytes.len() < header_start {
        return Err(NpyError::Truncated {
            needed: header_start,
            found: bytes.len(),
        });
    }
    let header_len = if len_bytes == 2 {
        u16::from_le_bytes([bytes[8], bytes[9]]) as usize
    } else {
        u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize
    };
    let data_start = header_start
        .checked_add(header_len)
        .ok_or(NpyError::Truncated {
            needed: usize::MAX,
            found: bytes.len(),
        })?;
    if bytes.len() < data_start {
        return Err(NpyError::Truncated {
            needed: data_start,
            found: bytes.len(),
        });
    }
    let header = std::str::from_utf8(&bytes[header_start..data_start])
        .map_err(|_| NpyError::BadHeader("the header is not UTF-8/ASCII text".into()))?;
    let (descr, fortran, shape) = parse_header(header)?;
    let dtype = match descr.as_str() {
        "<f2" => NpyDtype::F2,
        "<f4" => NpyDtype::F4,
        "<f8" => NpyDtype::F8,
        "|u1" | "<u1" => NpyDtype::U1,
        other => return Err(NpyError::UnsupportedDtype(other.to_string())),
    };
    if fortran {
        return Err(NpyError::FortranOrder);
    }
    let elements = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| NpyError::BadHeader("the shape's element count overflows".into()))?;
    let expected = elements
        .checked_mul(dtype.size())
        .ok_or_else(|| NpyError::BadHeader("the shape's byte count overflows".into()))?;
    let data = &bytes[data_start..];
    if data.len() != expected {
        return Err(NpyError::DataLength {
            expected,
            found: data.len(),
        });
    }
    Ok(NpyArray {
        dtype,
        shape: Shape(shape),
        data: data.to_vec(),
    })
}

/// Reads `descr`, `fortran_order` and `shape` from the header's Python dict literal.
fn parse_header(header: &str) -> Result<(String, bool, Vec<usize>), NpyError> {
    let bad = |why: &str| NpyError::BadHeader(format!("{why} in {:?}", header.trim_end()));
    let body = header
        .trim()
        .strip_prefix('{')
        .and_then(|h| h.trim_end().strip_suffix('}'))
        .ok_or_else(|| bad("expected a dict literal"))?;
    let value_after = |key: &str| -> Result<&str, NpyError> {
        let at = body
            .find(&format!("'{key}'"))
            .or_else(|| body.find(&format!("\"{key}\"")))
            .ok_or_else(|| bad(&format!("no '{key}' key")))?;
        let rest = &body[at + key.len() + 2..];
        let rest = rest
            .trim_start()
            .strip_prefix(':')
            .ok_or_else(|| bad(&format!("no ':' after '{key}'")))?;
        Ok(rest.trim_start())
    };
    let descr_text = value_after("descr")?;
    let quote = descr_text
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"');
    let quote = quote
        .ok_or_else(|| bad("'descr' is not a string (structured dtypes are not supported)"))?;
    let end = descr_text[1..]
        .find(quote)
        .ok_or_else(|| bad("unterminated 'descr' string"))?;
    let descr = descr_text[1..1 + end].to_string();
    let fortran_text = value_after("fortran_order")?;
    let fortran = if fortran_text.starts_with("True") {
        true
    } else if fortran_text.starts_with("False") {
        false
    } else {
        return Err(bad("'fortran_order' is neither True nor False"));
    };
    let shape_text = value_after("shape")?;
    let inner = shape_text
        .strip_prefix('(')
        .and_then(|s| s.find(')').map(|e| &s[..e]))
        .ok_or_else(|| bad("'shape' is not a tuple"))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| bad(&format!("bad dimension '{s}'")))
        })
        .collect::<Result<Vec<usize>, NpyError>>()?;
    Ok((descr, fortran, shape))
}

/// Serialises a tensor as `.npy`: f32 as `<f4`, f16 as `<f2`, fp8 as `|u1`
/// codes. Version 1.0 unless the header needs more than 65535 bytes; the
/// header is padded so that the data starts at a multiple of 64 bytes.
pub fn write(tensor: &Tensor) -> Vec<u8> {
    let descr = match tensor.dtype() {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::Fp8 { .. } => "|u1",
    };
    let dims = tensor.shape().dims();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let mut out = Vec::new();
    let (version, prefix) = if dict.len() + 1 + 10 <= 65535 {
        (1u8, 10)
    } else {
        (2u8, 12)
    };
    let total = (prefix + dict.len() + 1).div_ceil(64) * 64;
    let header_len = total - prefix;
    out.extend_from_slice(MAGIC);
    out.extend([version, 0]);
    if version == 1 {
        out.extend((header_len as u16).to_le_bytes());
    } else {
        out.extend((header_len as u32).to_le_bytes());
    }
    out.extend(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', header_len - dict.len() - 1));
    out.push(b'\n');
    out.extend(tensor.to_bytes());
    out
}

/// Reads a `.npy` file as a tensor of type `ty`; errors name the file.
pub fn read_file(path: &std::path::Path, ty: &TensorType) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&bytes)
        .and_then(|a| a.to_tensor(ty))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes a tensor as a `.npy` file; errors name the file.
pub fn write_file(path: &std::path::Path, tensor: &Tensor) -> Result<(), String> {
    std::fs::write(path, write(tensor)).map_err(|e| format!("{}: {e}", path.display()))
}
