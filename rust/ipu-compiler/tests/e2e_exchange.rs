//! GEMM chains whose hand-off is an inter-tile exchange step: the planner
//! picks per-GEMM plans and an exchange (scheduled by ipu-exchange, checked
//! by its independent checker after place_storage) when that is estimated
//! faster than the shared row partition. The packages run on the simulator
//! through ipu-runtime and are verified against ipu-reference; estimated and
//! simulated cycles are printed and compared.

use ipu_compiler::{compile, CompileOutput};

mod common;
use common::*;

/// The report's exchange facts: (chosen hand-off, the run call's exchange
/// steps). (The initialize call may start with one more: the copies of
/// parameters held more than once.)
fn exchange_facts(out: &CompileOutput) -> (String, Vec<serde_json::Value>) {
    let r = &out.report;
    (
        r["chain_handoff"]["chosen"]
            .as_str()
            .unwrap_or("none")
            .to_string(),
        all_steps(out)
            .into_iter()
            .filter(|s| s["call"] == "run")
            .collect(),
    )
}

/// Every exchange step the report lists, of both calls.
fn all_steps(out: &CompileOutput) -> Vec<serde_json::Value> {
    out.report["exchange_steps"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Checks what the driver promises about every exchange step: it was
/// checked after placement (the checker's counts equal the scheduler's),
/// every tile runs the prologue, and the estimate is close to the simulator.
fn check_exchange_package(ran: &Ran, steps_expected: usize) {
    let out = &ran.compile;
    let (chosen, steps) = exchange_facts(out);
    assert_eq!(chosen, "exchange");
    assert_eq!(steps.len(), steps_expected, "{:#}", out.report);
    let every = all_steps(out);
    for s in &every {
        let f = &s["figures"];
        assert_eq!(s["checked"]["descriptors"], f["descriptors"], "{s:#}");
        assert!(s["checked"]["words_delivered"].as_u64().unwrap() > 0);
        assert!(f["selected_horizon"].as_u64() >= f["lower_bound"].as_u64());
        println!(
            "exchange step `{}`: transfers={} descriptors={} initial_horizon={} selected_horizon={} lower_bound={} endpoint_lower_bound={} gap={} estimated_step_cycles={}",
            s["step"].as_str().unwrap(),
            f["transfers"], f["descriptors"], f["initial_horizon"], f["selected_horizon"],
            f["lower_bound"], f["endpoint_lower_bound"], f["lower_bound_gap"], s["estimated_cycles"]
        );
    }
    for (tile, program) in &out.programs {
        assert_eq!(
            // One exchange record (`rt_exchange` or `rt_exchange_w`) of the
            // program table per step.
            program.matches(".word rt_exchange").count(),
            every.len(),
            "tile {tile} runs every exchange step"
        );
    }
    // The simulated run and the estimate both include the final host
    // sync; they should be within 10%.
    let estimate = out.estimated_compute_cycles;
    let simulated = ran.run_device_cycles;
    let error = (estimate as f64 - simulated as f64).abs() / simulated as f64;
    println!(
        "estimated {estimate}, simulated run device cycles = {simulated}, error {:.1}%",
        100.0 * error
    );
    assert!(error < 0.10, "estimate {estimate} vs simulated {simulated}");
}

#[test]
fn mlp_small_hands_off_by_exchange_on_64_tiles() {
    let ran = compile_and_run(&root().join("models/mlp_small.ipug"), 64, 13);
    // The copy of `x` from where the host wrote it once (every column
    // part's tiles read its rows), then the hand-off.
    check_exchange_package(&ran, 2);
    let (_, steps) = exchange_facts(&ran.compile);
    assert_eq!(
        steps[0]["step"], "exchange x -> segment 0",
        "{:#}",
        steps[0]
    );
    // More tiles than the shared row partition's 17.
    assert!(ran.compile.package.info.tile_count > 17);
}

/// Estimated vs simulated cycles of mlp_small over tile budgets (the
/// shared row partition used at most 17 tiles: 19,895 simulated cycles).
#[test]
fn mlp_small_figures_over_tile_budgets() {
    for tiles in [5, 128, 1472] {
        let ran = compile_and_run(&root().join("models/mlp_small.ipug"), tiles, 17);
        let (chosen, steps) = exchange_facts(&ran.compile);
        println!("budget {tiles}: hand-off {chosen}");
        if chosen == "exchange" {
            check_exchange_package(&ran, steps.len());
        }
    }
}

#[test]
fn three_gemm_chain_without_bias_runs_two_hand_off_steps() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(
        dir.path(),
        "chain3",
        "model chain3\ninput x: f16[24, 40]\nparam w1: f16[40, 200]\nparam w2: f16[200, 72]\nparam w3: f16[72, 48]\nh = gemm(x, w1)\ng = gelu(h)\nz = gemm(g, w2)\ny = gemm(z, w3)\noutput y\n",
    );
    let ran = compile_and_run(&model, 96, 29);
    // The copy of `x` from its home, then two hand-offs.
    check_exchange_package(&ran, 3);
}

#[test]
fn few_tiles_keep_the_shared_row_partition() {
    let cache = tempfile::tempdir().unwrap();
    let out = compile(&options(
        &root().join("models/mlp_small.ipug"),
        1,
        cache.path(),
    ))
    .unwrap();
    let (chosen, steps) = exchange_facts(&out);
    assert_eq!(chosen, "shared_rows", "{:#}", out.report["chain_handoff"]);
    assert!(steps.is_empty());
    assert!(out.programs.values().all(|p| !p.contains("xtab")));
}

#[test]
fn exchange_packages_are_deterministic() {
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&root().join("models/mlp_small.ipug"), 64, cache.path());
    let a = compile(&opts).unwrap().package.to_bytes().unwrap();
    let b = compile(&opts).unwrap().package.to_bytes().unwrap();
    assert!(a == b, "two compiles differ");
}
