//! Operations, their attributes and their type rules.
//!
//! [`infer`] is the single source of truth for what an operation accepts and
//! what it produces; the builder, the parser and the verifier all call it, so a
//! graph that passes one passes the others.

use std::fmt;

use crate::types::{broadcast_shapes, DType, Shape, TensorType};

/// Default epsilon of `layernorm` (the SigLIP and ViT value).
pub const DEFAULT_LAYERNORM_EPSILON: f64 = 1e-6;

/// One operation of the graph. The operands are the node's arguments, in the
/// order given in each variant's documentation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `gemm(a, b)`: batched matrix product `a @ b`.
    ///
    /// `a` is `[..., M, K]` (`[..., K, M]` when `transpose_a`), `b` is
    /// `[..., K, N]` (`[..., N, K]` when `transpose_b`); the batch dimensions
    /// broadcast like numpy's and the result is `[..., M, N]`. Both operands have
    /// the same kind of dtype (f32, f16, or fp8 of any scales). The result is
    /// `out` when given, else f32 for f32, f16 for f16 and fp8 operands.
    Gemm {
        /// Use `a` transposed (its last two axes swapped).
        transpose_a: bool,
        /// Use `b` transposed.
        transpose_b: bool,
        /// Result dtype when it differs from the default.
        out: Option<DType>,
    },
    /// `add(a, b)`: elementwise sum with numpy broadcasting; equal dtypes.
    Add,
    /// `gelu(x)`: GELU, tanh approximation
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Gelu,
    /// `layernorm(x, gamma, beta)`: normalise over the last axis of `x`
    /// (biased variance), then scale by `gamma` and shift by `beta`, both of
    /// shape `[N]` where `N` is the last dimension of `x`.
    LayerNorm {
        /// Added to the variance before the square root.
        epsilon: f64,
    },
    /// `softmax(x)`: softmax over the last axis.
    Softmax,
    /// `split_heads(x)`: view `[..., S, H*D]` as `[..., H, S, D]`.
    SplitHeads {
        /// Number of heads `H`.
        heads: usize,
    },
    /// `merge_heads(x)`: view `[..., H, S, D]` as `[..., S, H*D]`.
    MergeHeads,
    /// `attention(q, k, v)`: per head `softmax(scale * q k^T) v` with
    /// `q: [..., H, Sq, D]`, `k: [..., H, Sk, D]`, `v: [..., H, Sk, Dv]`,
    /// result `[..., H, Sq, Dv]`. When `causal`, query `i` sees key `j` only if
    /// `j <= i + (Sk - Sq)` (aligned at the bottom right, so self-attention is
    /// the usual lower triangle), which needs `Sq <= Sk`.
    Attention {
        /// Mask future keys.
        causal: bool,
        /// Score scale; `None` means `1 / sqrt(D)`.
        scale: Option<f64>,
    },
    /// `cast(x, to=dtype)`: convert elements, rounding to nearest even.
    Cast {
        /// Result dtype.
        to: DType,
    },
    /// `transpose(x)`: `x` with its last two axes swapped, `[..., M, N]` to
    /// `[..., N, M]`, any dtype.
    Transpose,
}

impl Op {
    /// The operation's name in the text format.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Gemm { .. } => "gemm",
            Op::Add => "add",
            Op::Gelu => "gelu",
            Op::LayerNorm { .. } => "layernorm",
            Op::Softmax => "softmax",
            Op::SplitHeads { .. } => "split_heads",
            Op::MergeHeads => "merge_heads",
            Op::Attention { .. } => "attention",
            Op::Cast { .. } => "cast",
            Op::Transpose => "transpose",
        }
    }

    /// Number of operands.
    pub fn arity(&self) -> usize {
        match self {
            Op::Gemm { .. } | Op::Add => 2,
            Op::LayerNorm { .. } | Op::Attention { .. } => 3,
            Op::Gelu
            | Op::Softmax
            | Op::SplitHeads { .. }
            | Op::MergeHeads
            | Op::Cast { .. }
            | Op::Transpose => 1,
        }
    }

    /// Whether the operation only reinterprets its operand's layout (no
    /// arithmetic): the compiler may implement it as a view or a rearrangement.
    pub fn is_view(&self) -> bool {
        matches!(self, Op::SplitHeads { .. } | Op::MergeHeads)
    }

    /// The effective attention scale for head size `d`.
    pub fn attention_scale(scale: Option<f64>, d: usize) -> f64 {
        scale.unwrap_or(1.0 / (d as f64).sqrt())
    }
}

/// Why an operation does not accept its operands. Messages name the operation
/// and show every type involved.
#[derive(Clone, Debug, PartialEq)]
pub enum TypeError {
    /// Wrong number of operands.
    Arity {
        /// Operation name.
        op: &'static str,
        /// Operands it takes.
        expected: usize,
        /// Operands given.
        found: usize,
    },
    /// The operation does not accept an operand of this dtype.
    UnsupportedDtype {
        /// Operation name.
        op: &'static str,
        /// Which operand.
        operand: &'static str,
        /// Its type.
        ty: TensorType,
        /// What would be accepted.
        accepted: &'static str,
    },
    /// Two operands must agree in dtype and do not.
    DtypeMismatch {
        /// Operation name.
        op: &'static str,
        /// The first operand's role and type.
        left: (&'static str, TensorType),
        /// The second operand's role and type.
        right: (&'static str, TensorType),
    },
    /// Two operands' shapes are incompatible.
    ShapeMismatch {
        /// Operation name.
        op: &'static str,
        /// The rule that failed.
        rule: String,
        /// The first operand's role and type.
        left: (&'static str, TensorType),
        /// The second operand's role and type.
        right: (&'static str, TensorType),
    },
    /// One operand's shape is unusable on its own.
    BadShape {
        /// Operation name.
        op: &'static str,
        /// Which operand.
        operand: &'static str,
        /// Its type.
        ty: TensorType,
        /// What is wrong.
        reason: String,
    },
    /// An attribute value is out of range.
    BadAttribute {
        /// Operation name.
        op: &'static str,
        /// Attribute name.
        attribute: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for TypeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TypeError::Arity {
                op,
                expected,
                found,
            } => {
                write!(f, "{op} takes {expected} operand(s), found {found}")
            }
            TypeError::UnsupportedDtype {
                op,
                operand,
                ty,
                accepted,
            } => {
                write!(
                    f,
                    "{op}: operand {operand} has type {ty}, but {op} accepts {accepted}"
                )
            }
            TypeError::DtypeMismatch { op, left, right } => write!(
                f,
                "{op}: dtype mismatch: {} is {} but {} is {}",
                left.0, left.1, right.0, right.1
            ),
            TypeError::ShapeMismatch {
                op,
                rule,
                left,
                right,
            } => write!(
                f,
                "{op}: shape mismatch: {} is {} and {} is {} ({rule})",
                left.0, left.1, right.0, right.1
            ),
            TypeError::BadShape {
                op,
                operand,
                ty,
                reason,
            } => {
                write!(f, "{op}: operand {operand} has type {ty}: {reason}")
            }
            TypeError::BadAttribute {
                op,
                attribute,
                reason,
            } => {
                write!(f, "{op}: attribute {attribute}: {reason}")
            }
        }
    }
}

impl std::error::Error for TypeError {}

fn need_arithmetic(
    op: &'static str,
    operand: &'static str,
    ty: &TensorType,
) -> Result<(), TypeError> {
    if ty.dtype.is_arithmetic() {
        Ok(())
    } else {
        Err(TypeError::UnsupportedDtype {
            op,
            operand,
            ty: ty.clone(),
            accepted: "f16 or f32 (cast fp8 values first)",
        })
    }
}

fn need_rank(
    op: &'static str,
    operand: &'static str,
    ty: &TensorType,
    rank: usize,
) -> Result<(), TypeError> {
    if ty.shape.rank() >= rank {
        Ok(())
    } else {
        Err(TypeError::BadShape {
            op,
            operand,
            ty: ty.clone(),
            reason: format!("needs rank at least {rank}"),
        })
    }
}

fn same_dtype(
    op: &'static str,
    left: (&'static str, &TensorType),
    right: (&'static str, &TensorType),
) -> Result<(), TypeError> {
    if left.1.dtype == right.1.dtype {
        Ok(())
    } else {
        Err(TypeError::DtypeMismatch {
            op,
            left: (left.0, left.1.clone()),
            right: (right.0, right.1.clone()),
        })
    }
}

fn shape_mismatch(
    op: &'static str,
    rule: impl Into<String>,
    left: (&'static str, &TensorType),
    right: (&'static str, &TensorType),
) -> TypeError {
    TypeError::ShapeMismatch {
        op,
        rule: rule.into(),
        left: (left.0, left.1.clone()),
        right: (right.0, right.1.clone()),
    }
}

/// The result type of `op` applied to operands of types `args`.
pub fn infer(op: &Op, args: &[&TensorType]) -> Result<TensorType, TypeError> {
    let name = op.name();
    if args.len() != op.arity() {
        return Err(TypeError::Arity {
            op: name,
            expected: op.arity(),
            found: args.len(),
        });
    }
    match op {
        Op::Gemm {
            transpose_a,
            transpose_b,
            out,
        } => {
            let (a, b) = (args[0], args[1]);
            need_rank(name, "a", a, 2)?;
            need_rank(name, "b", b, 2)?;
            let default_out = match (a.dtype, b.dtype) {
                (DType::F32, DType::F32) => DType::F32,
                (DType::F16, DType::F16) => DType::F16,
                (DType::Fp8 { .. }, DType::Fp8 { .. }) => DType::F16,
                _ => {
                    return Err(TypeError::DtypeMismatch {
                        op: name,
                        left: ("a", a.clone()),
                        right: ("b", b.clone()),
                    })
                }
            };
            let out = out.unwrap_or(default_out);
            let allowed = match a.dtype {
                DType::F32 => out == DType::F32,
                _ => out.is_arithmetic(),
            };
            if !allowed {
                return Err(TypeError::BadAttribute {
                    op: name,
                    attribute: "out",
                    reason: format!(
                        "a gemm of {} operands cannot produce {out} (f32 operands give f32; f16 and fp8 operands give f16 or f32)",
                        a.dtype
                    ),
                });
            }
            let (ad, bd) = (a.shape.dims(), b.shape.dims());
            let (m, ka) = if *transpose_a {
                (ad[ad.len() - 1], ad[ad.len() - 2])
            } else {
                (ad[ad.len() - 2], ad[ad.len() - 1])
            };
            let (kb, n) = if *transpose_b {
                (bd[bd.len() - 1], bd[bd.len() - 2])
            } else {
                (bd[bd.len() - 2], bd[bd.len() - 1])
            };
            if ka != kb {
                return Err(shape_mismatch(
                    name,
                    format!(
                        "inner dimensions differ: K of a is {ka}, K of b is {kb}{}",
                        match (transpose_a, transpose_b) {
                            (false, false) => "",
                            (true, false) => "; a is transposed",
                            (false, true) => "; b is transposed",
                            (true, true) => "; a and b are transposed",
                        }
                    ),
                    ("a", a),
                    ("b", b),
                ));
            }
            let batch =
                broadcast_shapes(&ad[..ad.len() - 2], &bd[..bd.len() - 2]).ok_or_else(|| {
                    shape_mismatch(
                        name,
                        "batch dimensions do not broadcast",
                        ("a", a),
                        ("b", b),
                    )
                })?;
            let mut dims = batch;
            dims.extend([m, n]);
            Ok(TensorType::new(out, dims))
        }
        Op::Add => {
            let (a, b) = (args[0], args[1]);
            need_arithmetic(name, "a", a)?;
            same_dtype(name, ("a", a), ("b", b))?;
            let dims = broadcast_shapes(a.shape.dims(), b.shape.dims()).ok_or_else(|| {
                shape_mismatch(name, "shapes do not broadcast", ("a", a), ("b", b))
            })?;
            Ok(TensorType::new(a.dtype, dims))
        }
        Op::Gelu | Op::Softmax => {
            let x = args[0];
            need_arithmetic(name, "x", x)?;
            if matches!(op, Op::Softmax) {
                need_rank(name, "x", x, 1)?;
            }
            Ok(x.clone())
        }
        Op::LayerNorm { epsilon } => {
            let (x, gamma, beta) = (args[0], args[1], args[2]);
            if !(epsilon.is_finite() && *epsilon >= 0.0) {
                return Err(TypeError::BadAttribute {
                    op: name,
                    attribute: "epsilon",
                    reason: format!("must be finite and non-negative, found {epsilon:?}"),
                });
            }
            need_arithmetic(name, "x", x)?;
            need_rank(name, "x", x, 1)?;
            same_dtype(name, ("x", x), ("gamma", gamma))?;
            same_dtype(name, ("x", x), ("beta", beta))?;
            let n = x.shape.last().unwrap_or(1);
            for (role, p) in [("gamma", gamma), ("beta", beta)] {
                if p.shape.dims() != [n] {
                    return Err(shape_mismatch(
                        name,
                        format!("{role} must be [{n}], the last dimension of x"),
                        ("x", x),
                        (role, p),
                    ));
                }
            }
            Ok(x.clone())
        }
        Op::SplitHeads { heads } => {
            let x = args[0];
            if *heads == 0 {
                return Err(TypeError::BadAttribute {
                    op: name,
                    attribute: "heads",
                    reason: "must be at least 1".into(),
                });
            }
            need_rank(name, "x", x, 2)?;
            let d = x.shape.dims();
            let (s, hd) = (d[d.len() - 2], d[d.len() - 1]);
            if hd % heads != 0 {
                return Err(TypeError::BadShape {
                    op: name,
                    operand: "x",
                    ty: x.clone(),
                    reason: format!("last dimension {hd} is not divisible by heads={heads}"),
                });
            }
            let mut dims = d[..d.len() - 2].to_vec();
            dims.extend([*heads, s, hd / heads]);
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Transpose => {
            let x = args[0];
            need_rank(name, "x", x, 2)?;
            let mut dims = x.shape.dims().to_vec();
            let r = dims.len();
            dims.swap(r - 2, r - 1);
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::MergeHeads => {
            let x = args[0];
            need_rank(name, "x", x, 3)?;
            let d = x.shape.dims();
            let (h, s, hd) = (d[d.len() - 3], d[d.len() - 2], d[d.len() - 1]);
            let mut dims = d[..d.len() - 3].to_vec();
            dims.extend([s, h * hd]);
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Attention { causal, scale } => {
            let (q, k, v) = (args[0], args[1], args[2]);
            if let Some(s) = scale {
                if !s.is_finite() {
                    return Err(TypeError::BadAttribute {
                        op: name,
                        attribute: "scale",
                        reason: format!("must be finite, found {s:?}"),
                    });
                }
            }
            need_arithmetic(name, "q", q)?;
            same_dtype(name, ("q", q), ("k", k))?;
            same_dtype(name, ("q", q), ("v", v))?;
            need_rank(name, "q", q, 2)?;
            need_rank(name, "k", k, 2)?;
            need_rank(name, "v", v, 2)?;
            let (qd, kd, vd) = (q.shape.dims(), k.shape.dims(), v.shape.dims());
            let lead = |d: &[usize]| d[..d.len() - 2].to_vec();
            if lead(qd) != lead(kd) {
                return Err(shape_mismatch(
                    name,
                    "batch and head dimensions differ",
                    ("q", q),
                    ("k", k),
                ));
            }
            if lead(qd) != lead(vd) {
                return Err(shape_mismatch(
                    name,
                    "batch and head dimensions differ",
                    ("q", q),
                    ("v", v),
                ));
            }
            let (sq, d) = (qd[qd.len() - 2], qd[qd.len() - 1]);
            let (sk, dk) = (kd[kd.len() - 2], kd[kd.len() - 1]);
            let (sv, dv) = (vd[vd.len() - 2], vd[vd.len() - 1]);
            if d != dk {
                return Err(shape_mismatch(
                    name,
                    format!("head size of q is {d}, of k is {dk}"),
                    ("q", q),
                    ("k", k),
                ));
            }
            if sk != sv {
                return Err(shape_mismatch(
                    name,
                    format!("key length of k is {sk}, of v is {sv}"),
                    ("k", k),
                    ("v", v),
                ));
            }
            if *causal && sq > sk {
                return Err(shape_mismatch(
                    name,
                    format!("causal attention needs query length {sq} <= key length {sk}"),
                    ("q", q),
                    ("k", k),
                ));
            }
            let mut dims = lead(qd);
            dims.extend([sq, dv]);
            Ok(TensorType::new(q.dtype, dims))
        }
        Op::Cast { to } => Ok(TensorType {
            dtype: *to,
            shape: args[0].shape.clone(),
        }),
    }
}

/// The shape of a gemm's operand as used, after the optional transpose:
/// `(batch dims, rows, cols)`.
pub fn gemm_operand_dims(shape: &Shape, transpose: bool) -> (&[usize], usize, usize) {
    let d = shape.dims();
    let (r, c) = (d[d.len() - 2], d[d.len() - 1]);
    if transpose {
        (&d[..d.len() - 2], c, r)
    } else {
        (&d[..d.len() - 2], r, c)
    }
}
