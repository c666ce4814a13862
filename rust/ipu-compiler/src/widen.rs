//! Phase `widen`: fp8 GEMMs that must not accumulate in f16 run on the f16
//! AMP with their operands widened.
//!
//! `gemm_fp8` (`ampf8`) has one accumulation mode: every eight products
//! the accumulators round to f16. fp8 operands are coarse (4 significant
//! bits), so their exact sums sit on or near f16 rounding boundaries far
//! more often than sums of f16 operands do, and those roundings leave a
//! result one f16 step away from the exactly rounded value the reference
//! holds. That is within any GEMM's own tolerance, but an attention's
//! scores amplify it: a one-step difference in a row of q or k moved a
//! random fp8 attention's output by up to 2.4 times its tolerance (about 9
//! of every 100 random fp8 attention models were outside or near it, none
//! of the f16 ones, whose short projections accumulate in f32). Every F143
//! value with a scale in [`F16_EXACT_SCALES`] is an f16 value, so a cast to
//! f16 is exact and the GEMM of the widened operands computes the same
//! products; on `gemm_f16` it then accumulates as an f16 GEMM of that K
//! does, exactly in the cases above.
//!
//! An fp8 GEMM is widened when
//! - its result is f32 (`out=f32`): `gemm_fp8` has no f32 accumulation, so
//!   without this it is refused;
//! - `--option accumulation=f32` asks for f32 accumulation everywhere;
//! - under `Accumulation::Auto`, its result is q or k of an attention (through
//!   `split_heads`) and K < [`WIDEN_MAX_K`]: longer sums take bounded f16
//!   chains whose tolerance has room for these roundings (the fp8 SigLIP
//!   attention keeps `gemm_fp8` at its 4x rate).
//!
//! The rewrite adds `cast(v, to=f16)` (named `v.f16`) right after the
//! definition of each operand `v` of a widened GEMM, once per operand, and
//! points the GEMM at the casts; nothing else changes. Casts are row-wise
//! operations ([`crate::rowwise`]): a parameter's cast runs on the device in
//! every run call (its K x N elements, small for the K this applies to).
//! The model's graph, which the reference evaluates, keeps the fp8 GEMM.

use crate::{Accumulation, CompileError};
use ipu_graph::{DType, Graph, Op, ValueDef, ValueId};
use std::collections::BTreeMap;

/// fp8 scales whose every F143 value is an f16 value: the smallest
/// subnormal 2^(scale - 10) is at least f16's 2^-24, and the largest,
/// 240 * 2^scale, at most f16's 65,504.
pub const F16_EXACT_SCALES: std::ops::RangeInclusive<i8> = -14..=8;

/// Under `Accumulation::Auto`, the K below which an fp8 projection feeding
/// attention scores is widened: from K = 256 on, Auto cuts sums into bounded
/// f16 chains (`F16_CHAIN_MIN_BLOCKS`).
pub const WIDEN_MAX_K: u32 = 256;

/// Which fp8 GEMMs [`widen`] widens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Every one the module documentation lists.
    All,
    /// Only those with an f32 result, which `gemm_fp8` cannot produce
    /// (`compile`'s last fallback when the widened program does not fit).
    F32Results,
}

/// The reason given for an fp8 GEMM with an f32 result.
pub const F32_RESULT: &str = "an f32 result";

/// A widened GEMM, for the log and the compile report.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WidenedGemm {
    /// The GEMM's result.
    pub value: String,
    pub k: u32,
    pub reason: &'static str,
}

/// The graph with its widened GEMMs, and which they are.
pub struct Widened {
    pub graph: Graph,
    pub gemms: Vec<WidenedGemm>,
    /// GEMMs left on `gemm_fp8` for want of a `cast` FROM=8 TO=16
    /// specialisation of an operand's scale in the kernel library (a Bazel
    /// library holds the scales its BUILD file declares): (value, scale).
    pub lacking_casts: Vec<(String, i8)>,
}

/// Why GEMM `result` of `graph` (fp8 operands `args`) is widened, if it is.
fn reason(
    graph: &Graph,
    result: ValueId,
    args: &[ValueId],
    accumulation: Accumulation,
    purpose: Purpose,
) -> Option<&'static str> {
    let scale_fits = |v: ValueId| match graph.ty(v).dtype {
        DType::Fp8 { scale_log2 } => F16_EXACT_SCALES.contains(&scale_log2),
        _ => false,
    };
    if !args.iter().all(|&a| scale_fits(a)) {
        return None;
    }
    let k = graph.ty(args[0]).shape.dims()[1] as u32;
    if graph.ty(result).dtype == DType::F32 {
        return Some(F32_RESULT);
    }
    if purpose == Purpose::F32Results {
        return None;
    }
    match accumulation {
        Accumulation::F32 => Some("accumulation=f32"),
        Accumulation::F16 => None,
        Accumulation::Auto if k < WIDEN_MAX_K && feeds_scores(graph, result) => {
            Some("attention scores from a short fp8 sum")
        }
        Accumulation::Auto => None,
    }
}

/// Whether `v` is read (through `split_heads`) as q or k of an attention.
fn feeds_scores(graph: &Graph, v: ValueId) -> bool {
    graph.users(v).into_iter().any(|n| {
        let node = graph.node(n);
        match node.op {
            Op::SplitHeads { .. } => feeds_scores(graph, node.result),
            Op::Attention { .. } => node.args[..2].contains(&v),
            _ => false,
        }
    })
}

/// Rewrites `graph` (the device graph, GEMMs of rank 2 with untransposed
/// operands) as the module documentation says. A graph without a GEMM to
/// widen is returned unchanged.
/// `has_cast(scale)` says whether the kernel library has the cast of fp8 of
/// that scale to f16: a GEMM widened only for precision needs it for both
/// operands (else it stays on `gemm_fp8`, listed in `lacking_casts`); one
/// with an f32 result is widened anyway, and the row-wise lowering names
/// the missing kernel.
pub fn widen(
    graph: &Graph,
    accumulation: Accumulation,
    purpose: Purpose,
    has_cast: &mut dyn FnMut(i8) -> bool,
) -> Result<Widened, CompileError> {
    let mut gemms = Vec::new();
    let mut lacking_casts = Vec::new();
    // Operands to widen, and the GEMM nodes that read them widened.
    let mut operands = std::collections::BTreeSet::new();
    let mut widened_nodes = std::collections::BTreeSet::new();
    for (i, node) in graph.nodes().iter().enumerate() {
        if !matches!(node.op, Op::Gemm { .. })
            || !matches!(graph.ty(node.args[0]).dtype, DType::Fp8 { .. })
        {
            continue;
        }
        if let Some(why) = reason(graph, node.result, &node.args, accumulation, purpose) {
            let scales: Vec<i8> = node
                .args
                .iter()
                .map(|&a| match graph.ty(a).dtype {
                    DType::Fp8 { scale_log2 } => scale_log2,
                    _ => unreachable!("reason() widens fp8 operands only"),
                })
                .collect();
            if why != F32_RESULT {
                if let Some(&lacking) = scales.iter().find(|&&sc| !has_cast(sc)) {
                    lacking_casts.push((graph.value(node.result).name.clone(), lacking));
                    continue;
                }
            }
            operands.extend(node.args.iter().copied());
            widened_nodes.insert(i);
            gemms.push(WidenedGemm {
                value: graph.value(node.result).name.clone(),
                k: graph.ty(node.args[0]).shape.dims()[1] as u32,
                reason: why,
            });
        }
    }
    if gemms.is_empty() {
        return Ok(Widened {
            graph: graph.clone(),
            gemms,
            lacking_casts,
        });
    }
    let err = |v: ValueId, e: ipu_graph::GraphError| CompileError::Verifier {
        phase: "widen",
        message: format!("value `{}`: {e}", graph.value(v).name),
    };
    let mut out = Graph::new(graph.name());
    let mut map: Vec<Option<ValueId>> = vec![None; graph.values().len()];
    let mut wide: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    for (i, value) in graph.values().iter().enumerate() {
        let id = ValueId(i as u32);
        let new = match value.def {
            ValueDef::Input => out.add_input(&value.name, value.ty.clone()),
            ValueDef::Param => out.add_param(&value.name, value.ty.clone()),
            ValueDef::Node(n) => {
                let node = graph.node(n);
                let args: Vec<ValueId> = node
                    .args
                    .iter()
                    .map(|a| {
                        if widened_nodes.contains(&(n.0 as usize)) {
                            wide[a]
                        } else {
                            map[a.0 as usize].expect("arguments precede their node")
                        }
                    })
                    .collect();
                out.add_op(&value.name, node.op.clone(), &args)
            }
        }
        .map_err(|e| err(id, e))?;
        map[i] = Some(new);
        if operands.contains(&id) {
            // A name no model value has (model names may contain dots).
            let mut name = format!("{}.f16", value.name);
            while graph.lookup(&name).is_some() {
                name.push('_');
            }
            let cast = out
                .add_op(&name, Op::Cast { to: DType::F16 }, &[new])
                .map_err(|e| err(id, e))?;
            wide.insert(id, cast);
        }
    }
    for &o in graph.outputs() {
        out.add_output(map[o.0 as usize].expect("every value is mapped"))
            .map_err(|e| err(o, e))?;
    }
    ipu_graph::verify(&out).map_err(|e| CompileError::Verifier {
        phase: "widen",
        message: e
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; "),
    })?;
    Ok(Widened {
        graph: out,
        gemms,
        lacking_casts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Graph {
        ipu_graph::parse("t.ipug", text).expect("parses")
    }

    const ATTENTION: &str = "model m\ninput x: f16[20, 24]\nparam wq: fp8<-4>[24, 24]\nparam wk: fp8<-4>[24, 24]\nparam wv: fp8<-4>[24, 24]\nx8 = cast(x, to=fp8)\nq = gemm(x8, wq)\nk = gemm(x8, wk)\nv = gemm(x8, wv)\nqh = split_heads(q, heads=2)\nkh = split_heads(k, heads=2)\nvh = split_heads(v, heads=2)\no = attention(qh, kh, vh, causal=false)\ny = merge_heads(o)\noutput y\n";

    #[test]
    fn short_fp8_projections_of_scores_read_widened_operands() {
        let w = widen(
            &parse(ATTENTION),
            Accumulation::Auto,
            Purpose::All,
            &mut |_| true,
        )
        .unwrap();
        let names: Vec<&str> = w.gemms.iter().map(|g| g.value.as_str()).collect();
        assert_eq!(names, ["q", "k"], "v's sum is not amplified by the scores");
        let g = &w.graph;
        let arg_names = |v: &str| -> Vec<String> {
            let n = g.def_node(g.lookup(v).unwrap()).unwrap();
            g.node(n)
                .args
                .iter()
                .map(|&a| g.value(a).name.clone())
                .collect()
        };
        assert_eq!(arg_names("q"), ["x8.f16", "wq.f16"]);
        assert_eq!(arg_names("k"), ["x8.f16", "wk.f16"]);
        assert_eq!(arg_names("v"), ["x8", "wv"]);
        // Each cast follows its operand's definition: the parameters'
        // casts come before the first node that is not one.
        let order: Vec<&str> = g
            .nodes()
            .iter()
            .map(|n| g.value(n.result).name.as_str())
            .collect();
        assert_eq!(&order[..4], ["wq.f16", "wk.f16", "x8", "x8.f16"]);
        assert_eq!(g.ty(g.lookup("wq.f16").unwrap()).dtype, DType::F16);
    }

    #[test]
    fn long_sums_forced_f16_and_unrepresentable_scales_stay_fp8() {
        let long = ATTENTION
            .replace("[20, 24]", "[20, 256]")
            .replace("[24, 24]", "[256, 256]")
            .replace("heads=2", "heads=4");
        assert!(
            widen(&parse(&long), Accumulation::Auto, Purpose::All, &mut |_| {
                true
            })
            .unwrap()
            .gemms
            .is_empty()
        );
        assert!(widen(
            &parse(ATTENTION),
            Accumulation::F16,
            Purpose::All,
            &mut |_| true
        )
        .unwrap()
        .gemms
        .is_empty());
        let coarse = ATTENTION.replace("fp8<-4>", "fp8<9>");
        assert!(widen(
            &parse(&coarse),
            Accumulation::F32,
            Purpose::All,
            &mut |_| true
        )
        .unwrap()
        .gemms
        .is_empty());
        // Forced f32 accumulation widens every fp8 GEMM whose scale fits.
        let all = widen(
            &parse(ATTENTION),
            Accumulation::F32,
            Purpose::All,
            &mut |_| true,
        )
        .unwrap();
        assert_eq!(all.gemms.len(), 3);
        assert!(all.gemms.iter().all(|g| g.reason == "accumulation=f32"));
    }

    #[test]
    fn a_library_without_the_operands_casts_keeps_gemm_fp8_for_precision_only() {
        // Only scale 0 has a cast: wq's and wk's fp8<-4> do not.
        let w = widen(
            &parse(ATTENTION),
            Accumulation::Auto,
            Purpose::All,
            &mut |s| s == 0,
        )
        .unwrap();
        assert!(w.gemms.is_empty());
        assert_eq!(
            w.lacking_casts,
            [("q".to_string(), -4), ("k".to_string(), -4)]
        );
        let text = "model m\ninput a: fp8[8, 32]\nparam b: fp8<-4>[32, 16]\nc = gemm(a, b, out=f32)\noutput c\n";
        let w = widen(&parse(text), Accumulation::Auto, Purpose::All, &mut |s| {
            s == 0
        })
        .unwrap();
        assert_eq!(w.gemms.len(), 1, "an f32 result needs the widening");
    }

    #[test]
    fn an_f32_result_is_widened_under_any_accumulation() {
        let text = "model m\ninput a: fp8[8, 32]\nparam b: fp8[32, 16]\nc = gemm(a, b, out=f32)\noutput c\n";
        for acc in [Accumulation::Auto, Accumulation::F16, Accumulation::F32] {
            let w = widen(&parse(text), acc, Purpose::F32Results, &mut |_| true).unwrap();
            assert_eq!(w.gemms.len(), 1);
            assert_eq!(w.gemms[0].reason, F32_RESULT);
            let g = &w.graph;
            assert_eq!(g.ty(g.lookup("c").unwrap()).dtype, DType::F32);
        }
        // A graph with nothing to widen is the same graph.
        let plain =
            parse("model m\ninput a: fp8[8, 32]\nparam b: fp8[32, 16]\nc = gemm(a, b)\noutput c\n");
        let w = widen(&plain, Accumulation::Auto, Purpose::All, &mut |_| true).unwrap();
        assert_eq!(ipu_graph::print(&w.graph), ipu_graph::print(&plain));
    }
}
