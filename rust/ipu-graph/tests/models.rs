//! Snapshot test of every model in the repository's `models/` directory: each
//! parses, verifies, round-trips and has the FLOP counts recorded in
//! `tests/models/<name>.out`.

mod common;

#[test]
fn models() {
    let models = common::crate_dir().join("../../models");
    let snapshots = common::crate_dir().join("tests/models");
    common::check_files(&models, &snapshots, "models");
}

/// The anchors quote 8.25 GFLOP (about 43,800 cycles at the f16 peak) for the
/// SigLIP attention workload; the model file must give exactly the formula's
/// count: three 729x1152x1152 projections plus QK^T and PV for 16 heads of 72.
#[test]
fn siglip_attention_flops_match_anchor() {
    let path = common::crate_dir().join("../../models/siglip_attention.ipug");
    let graph = ipu_graph::parse_file(&path).unwrap();
    let flops = ipu_graph::analysis::graph_flops(&graph);
    assert_eq!(
        flops.matmul,
        3 * 2 * 729 * 1152 * 1152 + 2 * 2 * 16 * 729 * 729 * 72
    );
    let bound = ipu_arch::compute_bound_cycles(flops.matmul, ipu_arch::TILES_PER_CHIP);
    assert_eq!(bound, 43_806);
}
