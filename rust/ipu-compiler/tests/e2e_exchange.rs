//! GEMM chains whose hand-off is an inter-tile exchange step: the planner
//! picks per-GEMM plans and an exchange (scheduled by ipu-exchange, checked
//! by its independent checker after place_storage) when that is estimated
//! faster than the shared row partition. The packages run on the simulator
//! through ipu-runtime and are verified against ipu-reference; estimated and
//! simulated cycles are printed and compared.

use ipu_compiler::{compile, CompileOptions, CompileOutput, KernelSource};
use ipu_package::Package;
use ipu_reference::{compare, evaluate, random, Tolerance};
use ipu_runtime::{Session, SimDevice};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../..")
}

fn options(model: &Path, tiles: u32, cache: &Path) -> CompileOptions {
    CompileOptions::new(
        model,
        tiles,
        KernelSource::Sources {
            device_dir: root().join("device"),
            cache_dir: Some(cache.to_path_buf()),
        },
    )
}

struct Ran {
    compile: CompileOutput,
    run_device_cycles: u64,
}

/// Compiles `model` for `tiles`, runs it on the simulator with seeded
/// Gaussian feeds and checks every output against the host reference.
fn compile_and_run(model: &Path, tiles: u32, seed: u64) -> Ran {
    let cache = tempfile::tempdir().unwrap();
    let (ran, _) = run_with(
        &options(model, tiles, cache.path()),
        |g| random::gaussian_feeds(g, seed),
        true,
    );
    ran
}

/// Compiles with `opts`, runs with `feeds(graph)`, checks every output
/// against the reference when `check`, and returns the outputs too.
fn run_with(
    opts: &CompileOptions,
    feeds: impl Fn(&ipu_graph::Graph) -> BTreeMap<String, ipu_reference::Tensor>,
    check: bool,
) -> (Ran, BTreeMap<String, ipu_reference::Tensor>) {
    let model = opts.model.as_path();
    let out = compile(opts).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let pkg =
        Package::from_bytes(&out.package.to_bytes().unwrap()).expect("the package reads back");
    assert_eq!(pkg, out.package);
    let graph = ipu_graph::parse(
        "model.ipug",
        std::str::from_utf8(&pkg.members["model.ipug"]).unwrap(),
    )
    .unwrap();
    let device = SimDevice::new(pkg.info.tile_count).unwrap();
    let mut session =
        Session::load(Box::new(device), pkg.clone(), None).unwrap_or_else(|e| panic!("{e}"));
    let feeds = feeds(&graph);
    let pick = |call: &str| -> BTreeMap<String, ipu_reference::Tensor> {
        let c = pkg.info.calls.iter().find(|c| c.name == call).unwrap();
        c.inputs
            .iter()
            .map(|t| (t.name.clone(), feeds[&t.name].clone()))
            .collect()
    };
    session
        .call("initialize", &pick("initialize"))
        .unwrap_or_else(|e| panic!("initialize: {e}"));
    let run = session
        .call("run", &pick("run"))
        .unwrap_or_else(|e| panic!("run: {e}"));
    let reference = evaluate(&graph, &feeds).unwrap();
    let k = ipu_graph::analysis::max_reduction_length(&graph);
    for (name, want) in reference.iter().filter(|_| check) {
        let got = &run.outputs[name];
        let tol = Tolerance::for_output(want.dtype(), k, want.data());
        let cmp = compare(got, want, tol).unwrap();
        assert!(
            cmp.passed(),
            "{}: output `{name}`: {cmp:?}",
            model.display()
        );
        assert!(
            cmp.cosine > 0.9999,
            "{}: output `{name}` cosine {}",
            model.display(),
            cmp.cosine
        );
    }
    println!(
        "{:<28} tiles={:<4} estimated_compute={:<8} simulated_run_device={:<8} estimated_run={:<8} compute_bound={}",
        model.file_name().unwrap().to_string_lossy(),
        out.package.info.tile_count,
        out.estimated_compute_cycles,
        run.cycles.device_cycles,
        out.estimated_run_cycles,
        out.package.info.report_summary["compute_bound_cycles"],
    );
    (
        Ran {
            compile: out,
            run_device_cycles: run.cycles.device_cycles,
        },
        run.outputs,
    )
}

fn write_model(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(format!("{name}.ipug"));
    std::fs::write(&p, text).unwrap();
    p
}

/// The report's exchange facts: (chosen hand-off, exchange steps).
fn exchange_facts(out: &CompileOutput) -> (String, Vec<serde_json::Value>) {
    let r = &out.report;
    (
        r["chain_handoff"]["chosen"]
            .as_str()
            .unwrap_or("none")
            .to_string(),
        r["exchange_steps"].as_array().cloned().unwrap_or_default(),
    )
}

/// Checks what the driver promises about every exchange step: it was
/// checked after placement (the checker's counts equal the scheduler's),
/// every tile runs the prologue, and the estimate is close to the simulator.
fn check_exchange_package(ran: &Ran, steps_expected: usize) {
    let out = &ran.compile;
    let (chosen, steps) = exchange_facts(out);
    assert_eq!(chosen, "exchange");
    assert_eq!(steps.len(), steps_expected, "{:#}", out.report);
    for s in &steps {
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
            program.matches("xtab $m1, $m2").count(),
            steps_expected,
            "tile {tile} runs every exchange step"
        );
    }
    // The simulated run includes the host sync; the estimate's compute
    // (exchange steps included) plus that sync should be within 10%.
    let estimate = out.estimated_compute_cycles + 600;
    let simulated = ran.run_device_cycles;
    let error = (estimate as f64 - simulated as f64).abs() / simulated as f64;
    println!("estimated compute + 600 = {estimate}, simulated run device cycles = {simulated}, error {:.1}%", 100.0 * error);
    assert!(error < 0.10, "estimate {estimate} vs simulated {simulated}");
}

#[test]
fn mlp_small_hands_off_by_exchange_on_64_tiles() {
    let ran = compile_and_run(&root().join("models/mlp_small.ipug"), 64, 13);
    check_exchange_package(&ran, 1);
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
fn three_gemm_chain_without_bias_runs_two_exchange_steps() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(
        dir.path(),
        "chain3",
        "model chain3\ninput x: f16[24, 40]\nparam w1: f16[40, 200]\nparam w2: f16[200, 72]\nparam w3: f16[72, 48]\nh = gemm(x, w1)\ng = gelu(h)\nz = gemm(g, w2)\ny = gemm(z, w3)\noutput y\n",
    );
    let ran = compile_and_run(&model, 96, 29);
    check_exchange_package(&ran, 2);
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
