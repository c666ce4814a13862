//! Comparing device output with the host reference.
//!
//! Tolerance rule (docs/graph-format.md, "Verification"): with `u` the unit
//! roundoff of the output dtype (f32 2^-24, f16 2^-11, fp8 2^-4), `K` the
//! longest reduction in the graph ([`ipu_graph::analysis::max_reduction_length`])
//! and `rms` the root mean square of the reference, an element passes when
//!
//! ```text
//! |device - reference| <= atol + rtol * |reference|
//! rtol = 4 u            (the output's own rounding plus the rounding of the
//!                        stored operands it was computed from, on both sides)
//! atol = u sqrt(K) rms  (round-off in a K-term sum grows like sqrt(K) times
//!                        the magnitude of the terms, which rms stands for)
//! ```
//!
//! For the SigLIP constant check (f16, K = 1152, rms = 1) this gives
//! atol = 0.0166 and rtol = 0.00195: an f16 output of 1.0 against the exact
//! 0.999756 passes, the seed log's 1.0430 fails.
//!
//! An f32 output takes four times that atol ([`F32_ACCUMULATION_MARGIN`]):
//! its own rounding is negligible, so what is left is the device's f32
//! accumulation, which rounds every partial sum (the AMP after every one or
//! two products) where the reference rounds once. Those roundings add up to
//! a standard deviation of about `0.3 u sqrt(K) rms`, so `u sqrt(K) rms`
//! alone is about 3.4 standard deviations, which some of a few thousand
//! correct elements exceed (a random-model test found f16 x f16 -> f32
//! GEMMs failing by one element in several thousand). Four times it is
//! about 13 standard deviations. f16 and fp8 outputs keep the plain rule:
//! their own rounding is 2^13 times coarser than f32 accumulation, and the
//! plain atol is what bounds the compiler's f16 accumulation chains.

use std::fmt;

use ipu_graph::{DType, Shape};

use crate::tensor::{unit_roundoff, Tensor};

/// The factor on an f32 output's atol (module documentation): room for the
/// device's f32 accumulation, whose roundings the f64 reference does not make.
pub const F32_ACCUMULATION_MARGIN: f64 = 4.0;

/// Absolute and relative tolerance of one comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part, multiplied by |reference|.
    pub rtol: f64,
}

impl Tolerance {
    /// The documented rule for an output of `dtype`, longest reduction
    /// `reduction_length` and reference values `reference`.
    pub fn for_output(dtype: DType, reduction_length: u64, reference: &[f64]) -> Tolerance {
        let u = unit_roundoff(dtype);
        let rms = if reference.is_empty() {
            0.0
        } else {
            (reference.iter().map(|r| r * r).sum::<f64>() / reference.len() as f64).sqrt()
        };
        let margin = if dtype == DType::F32 {
            F32_ACCUMULATION_MARGIN
        } else {
            1.0
        };
        Tolerance {
            atol: margin * u * (reduction_length.max(1) as f64).sqrt() * rms,
            rtol: 4.0 * u,
        }
    }

    /// The rule for an output of a graph that re-quantises computed values
    /// to fp8: [`Tolerance::for_output`] plus, per re-quantisation whose
    /// input has unit roundoff `u_in` (entries of `requantised`, see
    /// [`requantisations`]), `atol += 10 * sqrt(u_in / u8) * u8 * rms`
    /// (docs/graph-format.md, "Verification"). The device's and the
    /// reference's values entering the cast differ by about `u_in`
    /// relatively, so a fraction `u_in / u8` of them round to neighbouring
    /// fp8 values, `2 u8` apart; downstream sums add those flips as a random
    /// walk with standard deviation `sqrt(u_in / u8) * 2 u8 * rms`, and the
    /// bound allows five of them.
    pub fn for_output_requantised(
        dtype: DType,
        reduction_length: u64,
        reference: &[f64],
        requantised: &[f64],
    ) -> Tolerance {
        let mut t = Tolerance::for_output(dtype, reduction_length, reference);
        let rms = if reference.is_empty() {
            0.0
        } else {
            (reference.iter().map(|r| r * r).sum::<f64>() / reference.len() as f64).sqrt()
        };
        let u8 = unit_roundoff(DType::Fp8 { scale_log2: 0 });
        for &u_in in requantised {
            t.atol += 10.0 * (u_in / u8).sqrt() * u8 * rms;
        }
        t
    }

    /// Whether `device` is within tolerance of `reference` (NaN never is).
    pub fn accepts(&self, device: f64, reference: f64) -> bool {
        self.accepts_with(device, reference, 0.0)
    }

    /// Whether `device` is within tolerance of `reference` when the
    /// element's own row has the absolute term `row_atol` (a row that
    /// descends from an attention's query rows, [`crate::attention_row_atol`]):
    /// the absolute part is the larger of `atol` and `row_atol`.
    pub fn accepts_with(&self, device: f64, reference: f64, row_atol: f64) -> bool {
        (device - reference).abs() <= self.atol.max(row_atol) + self.rtol * reference.abs()
    }
}

/// The unit roundoff of the input of every cast in `graph` that rounds a
/// computed value (not a host input or parameter) to fp8, in graph order.
pub fn requantisations(graph: &ipu_graph::Graph) -> Vec<f64> {
    graph
        .nodes()
        .iter()
        .filter(|n| {
            matches!(
                n.op,
                ipu_graph::Op::Cast {
                    to: DType::Fp8 { .. }
                }
            ) && matches!(graph.value(n.args[0]).def, ipu_graph::ValueDef::Node(_))
        })
        .map(|n| unit_roundoff(graph.ty(n.args[0]).dtype))
        .collect()
}

/// What the reference looked like.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expected {
    /// Every element has this value.
    Constant(f64),
    /// Elements range over [min, max].
    Range {
        /// Smallest reference element.
        min: f64,
        /// Largest reference element.
        max: f64,
    },
}

/// One element outside tolerance.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// Full index into the output.
    pub index: Vec<usize>,
    /// Device value.
    pub device: f64,
    /// Reference value.
    pub reference: f64,
}

/// The result of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The tolerance applied.
    pub tolerance: Tolerance,
    /// The largest per-element atol of the element's own row, which
    /// replaces `tolerance.atol` where it is larger ([`Tolerance::accepts_with`]),
    /// when the output's rows descend from an attention's query rows
    /// ([`crate::rows::attention_rows`]).
    pub row_atol: Option<f64>,
    /// Elements compared.
    pub checks: u64,
    /// Elements outside tolerance.
    pub mismatches: u64,
    /// What the reference held.
    pub expected: Expected,
    /// Largest |device - reference| (infinite if the device gave NaN).
    pub max_abs_error: f64,
    /// Where it occurs.
    pub max_abs_index: Vec<usize>,
    /// Largest |device - reference| / |reference| over nonzero references.
    pub max_rel_error: f64,
    /// The first mismatch in row-major order.
    pub first_mismatch: Option<Mismatch>,
    /// Mismatch counts per index of the last axis.
    pub mismatches_by_column: Vec<u64>,
    /// Cosine similarity of the two tensors as vectors.
    pub cosine: f64,
}

impl Comparison {
    /// Whether every element is within tolerance.
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }
}

/// Why two tensors cannot be compared.
#[derive(Clone, Debug, PartialEq)]
pub struct ShapeMismatch {
    /// Device shape.
    pub device: Shape,
    /// Reference element count or shape.
    pub reference: String,
}

impl fmt::Display for ShapeMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot compare: device output is {} but the reference is {}",
            self.device, self.reference
        )
    }
}

impl std::error::Error for ShapeMismatch {}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        index[k] = i % dims[k];
        i /= dims[k];
    }
    index
}

/// Compares a device tensor with reference values (same shape; the reference
/// may be unrounded, e.g. a constant like 0.999755859375).
pub fn compare_values(
    device: &Tensor,
    reference: &[f64],
    tolerance: Tolerance,
) -> Result<Comparison, ShapeMismatch> {
    compare_values_with(device, reference, tolerance, None)
}

/// [`compare_values`] with a per-element `row_atol` (same length as the
/// reference) that replaces the absolute tolerance of each element where it
/// is larger ([`Tolerance::accepts_with`]).
pub fn compare_values_with(
    device: &Tensor,
    reference: &[f64],
    tolerance: Tolerance,
    row_atol: Option<&[f64]>,
) -> Result<Comparison, ShapeMismatch> {
    let dims = device.shape().dims();
    if reference.len() != device.data().len()
        || row_atol.is_some_and(|a| a.len() != reference.len())
    {
        return Err(ShapeMismatch {
            device: device.shape().clone(),
            reference: format!(
                "{} elements{}",
                reference.len(),
                row_atol
                    .map(|a| format!(" with {} row tolerances", a.len()))
                    .unwrap_or_default()
            ),
        });
    }
    let columns = device.shape().last().unwrap_or(1);
    let mut by_column = vec![0u64; columns];
    let mut mismatches = 0u64;
    let mut first = None;
    let (mut max_abs, mut max_abs_at, mut max_rel) = (0.0f64, 0usize, 0.0f64);
    let (mut dot, mut dd, mut rr) = (0.0, 0.0, 0.0);
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for (i, (&d, &r)) in device.data().iter().zip(reference).enumerate() {
        let err = if d.is_nan() || r.is_nan() {
            f64::INFINITY
        } else {
            (d - r).abs()
        };
        if err > max_abs {
            max_abs = err;
            max_abs_at = i;
        }
        if r != 0.0 {
            max_rel = max_rel.max(err / r.abs());
        }
        let row = row_atol.map_or(0.0, |a| a[i]);
        if !tolerance.accepts_with(d, r, row) {
            mismatches += 1;
            by_column[i % columns] += 1;
            if first.is_none() {
                first = Some(Mismatch {
                    index: unravel(i, dims),
                    device: d,
                    reference: r,
                });
            }
        }
        dot += d * r;
        dd += d * d;
        rr += r * r;
        min = min.min(r);
        max = max.max(r);
    }
    let cosine = if dd == 0.0 && rr == 0.0 {
        1.0
    } else if dd == 0.0 || rr == 0.0 {
        0.0
    } else {
        dot / (dd.sqrt() * rr.sqrt())
    };
    Ok(Comparison {
        tolerance,
        row_atol: row_atol.map(|a| a.iter().copied().fold(0.0, f64::max)),
        checks: reference.len() as u64,
        mismatches,
        expected: if min == max {
            Expected::Constant(min)
        } else {
            Expected::Range { min, max }
        },
        max_abs_error: max_abs,
        max_abs_index: unravel(max_abs_at, dims),
        max_rel_error: max_rel,
        first_mismatch: first,
        mismatches_by_column: by_column,
        cosine,
    })
}

/// Compares a device tensor with a reference tensor of the same shape.
pub fn compare(
    device: &Tensor,
    reference: &Tensor,
    tolerance: Tolerance,
) -> Result<Comparison, ShapeMismatch> {
    compare_with(device, reference, tolerance, None)
}

/// [`compare`] with a per-element row atol ([`compare_values_with`]).
pub fn compare_with(
    device: &Tensor,
    reference: &Tensor,
    tolerance: Tolerance,
    row_atol: Option<&[f64]>,
) -> Result<Comparison, ShapeMismatch> {
    if device.shape() != reference.shape() {
        return Err(ShapeMismatch {
            device: device.shape().clone(),
            reference: reference.shape().to_string(),
        });
    }
    compare_values_with(device, reference.data(), tolerance, row_atol)
}

fn index_text(index: &[usize]) -> String {
    format!(
        "[{}]",
        index
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

impl fmt::Display for Comparison {
    /// A multi-line report; the first line is a summary fit for a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = if self.checks == 0 {
            0.0
        } else {
            100.0 * self.mismatches as f64 / self.checks as f64
        };
        writeln!(
            f,
            "{}: checks={} mismatches={} ({pct:.3}%) max_abs_error={:.6e} max_rel_error={:.6e} cosine={:.6}",
            if self.passed() { "PASS" } else { "FAIL" },
            self.checks,
            self.mismatches,
            self.max_abs_error,
            self.max_rel_error,
            self.cosine
        )?;
        writeln!(
            f,
            "  tolerance: |device - reference| <= {:.6e} + {:.6e} * |reference|",
            self.tolerance.atol, self.tolerance.rtol
        )?;
        if let Some(a) = self.row_atol {
            writeln!(
                f,
                "  atol of each row where larger (rows of an attention's query rows; up to {a:.6e})"
            )?;
        }
        match self.expected {
            Expected::Constant(v) => writeln!(f, "  expected: every element {v}")?,
            Expected::Range { min, max } => {
                writeln!(f, "  expected: elements in [{min:.6e}, {max:.6e}]")?
            }
        }
        writeln!(f, "  largest error at {}", index_text(&self.max_abs_index))?;
        match &self.first_mismatch {
            None => writeln!(f, "  first mismatch: none")?,
            Some(m) => writeln!(
                f,
                "  first mismatch at {}: device {} reference {}",
                index_text(&m.index),
                m.device,
                m.reference
            )?,
        }
        let bad: Vec<(usize, u64)> = self
            .mismatches_by_column
            .iter()
            .copied()
            .enumerate()
            .filter(|&(_, n)| n > 0)
            .collect();
        if bad.is_empty() {
            writeln!(f, "  mismatches by column: none")
        } else {
            const SHOWN: usize = 12;
            let list: Vec<String> = bad
                .iter()
                .take(SHOWN)
                .map(|(c, n)| format!("{c}:{n}"))
                .collect();
            let more = if bad.len() > SHOWN {
                format!(" ... ({} columns in all)", bad.len())
            } else {
                String::new()
            };
            writeln!(
                f,
                "  mismatches by column (column:count): {}{more}",
                list.join(" ")
            )
        }
    }
}

/// One output of a graph with everything its whole-graph check uses: the
/// reference, the rule's tolerance (the graph's longest reduction and
/// re-quantisations) and, for a value whose rows descend from an
/// attention's query rows, the rule's atol per row
/// ([`crate::attention_row_atol`]).
/// `ipu verify` and the compiler's end-to-end tests check outputs alike
/// through it.
#[derive(Clone, Debug)]
pub struct OutputCheck {
    /// The output's name.
    pub name: String,
    /// The reference value.
    pub reference: Tensor,
    /// The rule's tolerance.
    pub tolerance: Tolerance,
    /// Per element, the atol of its row where the output's rows descend
    /// from an attention's query rows (used where larger than
    /// `tolerance.atol`).
    pub row_atol: Option<Vec<f64>>,
}

impl OutputCheck {
    /// Compares the device's value of the output.
    pub fn compare(&self, device: &Tensor) -> Result<Comparison, ShapeMismatch> {
        compare_with(
            device,
            &self.reference,
            self.tolerance,
            self.row_atol.as_deref(),
        )
    }

    /// Element `i`'s error in units of its tolerance (infinite for NaN).
    pub fn excess(&self, device: &Tensor, i: usize) -> f64 {
        let (d, r) = (device.data()[i], self.reference.data()[i]);
        let atol = self
            .row_atol
            .as_ref()
            .map_or(self.tolerance.atol, |a| self.tolerance.atol.max(a[i]));
        let e = (d - r).abs() / (atol + self.tolerance.rtol * r.abs());
        if e.is_nan() {
            f64::INFINITY
        } else {
            e
        }
    }
}

/// The whole-graph checks of every output of `graph` on `feeds`, in output
/// order.
pub fn output_checks(
    graph: &ipu_graph::Graph,
    feeds: &std::collections::BTreeMap<String, Tensor>,
) -> Result<Vec<OutputCheck>, crate::EvalError> {
    let values = crate::evaluate_all(graph, feeds)?;
    let reduction = ipu_graph::analysis::max_reduction_length(graph);
    let requantised = requantisations(graph);
    Ok(graph
        .outputs()
        .iter()
        .map(|&id| {
            let reference = values[id.0 as usize].clone();
            OutputCheck {
                name: graph.value(id).name.clone(),
                tolerance: Tolerance::for_output_requantised(
                    reference.dtype(),
                    reduction,
                    reference.data(),
                    &requantised,
                ),
                row_atol: crate::attention_row_atol(
                    graph,
                    id,
                    &reference,
                    (reduction, &requantised),
                ),
                reference,
            }
        })
        .collect())
}
