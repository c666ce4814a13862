//! The harness shared by the end-to-end tests: compile a model, load the
//! package into the simulator through ipu-runtime's Session (which follows
//! docs/host-protocol.md), run "initialize" and "run", and compare with
//! ipu-reference. Each test binary uses part of it. Packages load onto a
//! simulator whose memory holds NaNs ([`load`]): a program that reads
//! memory it neither wrote nor declared zero at load fails its check.
#![allow(dead_code)]

use ipu_compiler::{compile, CompileOptions, CompileOutput, KernelSource};
use ipu_package::Package;
use ipu_reference::{output_checks, random};
use ipu_runtime::{Session, SimDevice};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../..")
}

pub fn options(model: &Path, tiles: u32, cache: &Path) -> CompileOptions {
    CompileOptions::new(
        model,
        tiles,
        KernelSource::Sources {
            device_dir: root().join("device"),
            cache_dir: Some(cache.to_path_buf()),
        },
    )
}

pub struct Ran {
    pub compile: CompileOutput,
    pub run_device_cycles: u64,
}

/// Asserts that the compiler's estimate of the run's cycles is within
/// `bound` (relative) of the simulated cycles, naming `what` otherwise;
/// returns (estimate, simulated).
pub fn assert_estimate_within(ran: &Ran, bound: f64, what: &str) -> (f64, f64) {
    let (est, sim) = (
        ran.compile.estimated_compute_cycles as f64,
        ran.run_device_cycles as f64,
    );
    assert!(
        (est / sim - 1.0).abs() < bound,
        "{what}: estimate {est} vs simulated {sim}"
    );
    (est, sim)
}

/// Compiles `model` for `tiles`, runs it on the simulator with seeded
/// Gaussian feeds and checks every output against the host reference.
pub fn compile_and_run(model: &Path, tiles: u32, seed: u64) -> Ran {
    let cache = tempfile::tempdir().unwrap();
    let (ran, _) = run_with(
        &options(model, tiles, cache.path()),
        |g| random::gaussian_feeds(g, seed),
        true,
    );
    ran
}

/// The compiled package as read back from its bytes (checked equal), its
/// model graph, and a simulator session with the package loaded onto
/// memory full of NaNs ([`load_onto`] with 0xFF).
pub fn load(out: &CompileOutput) -> (Package, ipu_graph::Graph, Session) {
    load_onto(out, Some(0xFF))
}

/// [`load`] onto a simulator whose tile memory holds `poison` in every
/// byte before the package loads (0xFF: f16 and f32 NaNs): a program that
/// reads memory it neither wrote nor declared zero at load (a buffer's
/// `zero` ranges, which the image writes) then computes with NaNs, where
/// a fresh simulator's zeros would hide it.
pub fn load_onto(out: &CompileOutput, poison: Option<u8>) -> (Package, ipu_graph::Graph, Session) {
    let pkg =
        Package::from_bytes(&out.package.to_bytes().unwrap()).expect("the package reads back");
    assert_eq!(pkg, out.package);
    let graph = ipu_graph::parse(
        "model.ipug",
        std::str::from_utf8(&pkg.members["model.ipug"]).unwrap(),
    )
    .unwrap();
    let device = match poison {
        Some(byte) => SimDevice::poisoned(pkg.info.tile_count, byte).unwrap(),
        None => SimDevice::new(pkg.info.tile_count).unwrap(),
    };
    let session =
        Session::load(Box::new(device), pkg.clone(), None).unwrap_or_else(|e| panic!("{e}"));
    (pkg, graph, session)
}

/// The tensors of `feeds` that the package's call `call` writes.
pub fn call_feeds(
    pkg: &Package,
    feeds: &BTreeMap<String, ipu_reference::Tensor>,
    call: &str,
) -> BTreeMap<String, ipu_reference::Tensor> {
    let c = pkg
        .info
        .calls
        .iter()
        .find(|c| c.name == call)
        .unwrap_or_else(|| panic!("the package has no call `{call}`"));
    c.inputs
        .iter()
        .map(|t| (t.name.clone(), feeds[&t.name].clone()))
        .collect()
}

/// Compiles with `opts`, runs with `feeds(graph)`, checks every output
/// against the reference when `check`, and returns the outputs too.
pub fn run_with(
    opts: &CompileOptions,
    feeds: impl Fn(&ipu_graph::Graph) -> BTreeMap<String, ipu_reference::Tensor>,
    check: bool,
) -> (Ran, BTreeMap<String, ipu_reference::Tensor>) {
    let model = opts.model.as_path();
    let out = compile(opts).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let (pkg, graph, mut session) = load(&out);
    let feeds = feeds(&graph);
    let pick = |call: &str| call_feeds(&pkg, &feeds, call);
    session
        .call("initialize", &pick("initialize"))
        .unwrap_or_else(|e| panic!("initialize: {e}"));
    let run = session
        .call("run", &pick("run"))
        .unwrap_or_else(|e| panic!("run: {e}"));
    let checks = output_checks(&graph, &feeds).unwrap();
    for out in checks.iter().filter(|_| check) {
        let name = &out.name;
        let cmp = out.compare(&run.outputs[name]).unwrap();
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

pub fn write_model(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(format!("{name}.ipug"));
    std::fs::write(&p, text).unwrap();
    p
}

/// The package's call `name`.
pub fn call<'o>(out: &'o CompileOutput, name: &str) -> &'o ipu_package::StreamingCall {
    out.package
        .info
        .calls
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("the package has no call `{name}`"))
}

/// The package's "run" call.
pub fn run_call(out: &CompileOutput) -> &ipu_package::StreamingCall {
    call(out, "run")
}

/// Host bytes the run call writes per input, and each input's size.
pub fn run_input_bytes(out: &CompileOutput) -> Vec<(String, u64, u64)> {
    call_input_bytes(out, "run")
}

/// Host bytes call `name` writes per input, and each input's size.
pub fn call_input_bytes(out: &CompileOutput, name: &str) -> Vec<(String, u64, u64)> {
    call(out, name)
        .inputs
        .iter()
        .map(|t| {
            let placed = t.placements.iter().map(|p| p.bytes as u64).sum();
            (t.name.clone(), placed, t.bytes())
        })
        .collect()
}

/// The names of the exchange steps the compile report lists, in order.
pub fn exchange_step_names(out: &CompileOutput) -> Vec<String> {
    out.report["exchange_steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .filter_map(|s| s["step"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The report of the GEMM operation that computes `value`.
pub fn operation<'r>(out: &'r CompileOutput, value: &str) -> &'r serde_json::Value {
    out.report["operations"]
        .as_array()
        .and_then(|ops| ops.iter().find(|op| op["value"] == value))
        .unwrap_or_else(|| panic!("no operation report for `{value}`"))
}

/// Compiles `model` for `tiles` again and checks it with the seed's
/// constant inputs (all-ones data, weights 1/W), as the Gaussian run did.
pub fn constant_check(model: &Path, tiles: u32) {
    let cache = tempfile::tempdir().unwrap();
    run_with(
        &options(model, tiles, cache.path()),
        random::constant_feeds,
        true,
    );
}

/// Compiles with `opts`, initializes once with seed `seeds[0]`'s
/// parameters and calls "run" once per seed on the same session (each
/// run's inputs from its seed, the parameters from the first), checking
/// every output of every run against the host reference: buffers that a
/// run reuses as scratch (a streamed GEMM's gather in its dead C buffer)
/// must leave nothing a later run depends on. Returns the compile output.
pub fn run_repeatedly(opts: &CompileOptions, seeds: &[u64]) -> CompileOutput {
    let model = opts.model.as_path();
    let out = compile(opts).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let (pkg, graph, mut session) = load(&out);
    let call_inputs = |call: &str| -> Vec<String> {
        let c = pkg.info.calls.iter().find(|c| c.name == call).unwrap();
        c.inputs.iter().map(|t| t.name.clone()).collect()
    };
    let params = random::gaussian_feeds(&graph, seeds[0]);
    let init: BTreeMap<String, ipu_reference::Tensor> = call_inputs("initialize")
        .into_iter()
        .map(|n| (n.clone(), params[&n].clone()))
        .collect();
    session
        .call("initialize", &init)
        .unwrap_or_else(|e| panic!("initialize: {e}"));
    for &seed in seeds {
        let mut feeds = random::gaussian_feeds(&graph, seed);
        feeds.extend(init.clone());
        let inputs: BTreeMap<String, ipu_reference::Tensor> = call_inputs("run")
            .into_iter()
            .map(|n| (n.clone(), feeds[&n].clone()))
            .collect();
        let run = session
            .call("run", &inputs)
            .unwrap_or_else(|e| panic!("run with seed {seed}: {e}"));
        for out in output_checks(&graph, &feeds).unwrap() {
            let name = &out.name;
            let cmp = out.compare(&run.outputs[name]).unwrap();
            assert!(
                cmp.passed(),
                "{}: run with seed {seed}: output `{name}`: {cmp:?}",
                model.display()
            );
        }
    }
    out
}

/// Compiles `model` for `tiles` with `host_inputs`, verifies it on the
/// simulator with every checkpoint checked against the whole-graph
/// reference (Gaussian seed 3), requires every checkpoint and output to
/// pass, and returns the checkpoints' names.
pub fn check_every_checkpoint(
    model: &Path,
    tiles: u32,
    host_inputs: ipu_compiler::HostInputs,
) -> Vec<String> {
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(model, tiles, cache.path());
    opts.host_inputs = host_inputs;
    check_every_checkpoint_of(&opts)
}

/// [`check_every_checkpoint`] of the model `opts` names, compiled with
/// `opts`.
#[allow(dead_code)]
pub fn check_every_checkpoint_of(opts: &ipu_compiler::CompileOptions) -> Vec<String> {
    let out = compile(opts).unwrap_or_else(|e| panic!("{}: {e}", opts.model.display()));
    checkpoints_hold(&out)
}

/// Verifies the package of `out` with every checkpoint checked against the
/// whole-graph reference (Gaussian seed 3), requires every checkpoint and
/// output to pass, and returns the checkpoints' names.
#[allow(dead_code)]
pub fn checkpoints_hold(out: &CompileOutput) -> Vec<String> {
    let model = &out.package.info.model;
    let report = verify_gaussian_with(out, 3, true).unwrap_or_else(|e| panic!("{model}: {e}"));
    assert!(report.passed(), "{model}:\n{report}");
    report.checkpoints.iter().map(|c| c.name.clone()).collect()
}

/// `ipu verify` on the package of `out` with seeded Gaussian inputs and
/// the diagnosis on: when an output is outside the tolerance, the run is
/// repeated with checkpoints and the model checked compositionally (each
/// checkpointed value against the exact computation from the device's own
/// values before it), which `VerifyReport::passed_compositionally` reports.
pub fn verify_gaussian(
    out: &CompileOutput,
    seed: u64,
) -> Result<ipu_runtime::verify::VerifyReport, String> {
    verify_gaussian_with(out, seed, false)
}

/// [`verify_gaussian`], with `check_checkpoints`: the run is repeated with
/// checkpoints even when the outputs pass, and every checkpointed value
/// is checked against the whole-graph reference.
#[allow(dead_code)]
pub fn verify_gaussian_with(
    out: &CompileOutput,
    seed: u64,
    check_checkpoints: bool,
) -> Result<ipu_runtime::verify::VerifyReport, String> {
    ipu_runtime::verify::verify_package(
        out.package.clone(),
        &ipu_runtime::verify::VerifyOptions {
            run: ipu_runtime::RunOptions {
                device: ipu_runtime::DeviceOptions::simulator(out.package.info.tile_count),
                feeds: ipu_runtime::FeedSpec {
                    generate: ipu_runtime::Generate::Gaussian { seed },
                    ..ipu_runtime::FeedSpec::default()
                },
                ..ipu_runtime::RunOptions::default()
            },
            diagnose: true,
            check_checkpoints,
        },
    )
    .map_err(|e| format!("verify: {e}"))
}

/// The model graph a package carries (`model.ipug`) and its parsed
/// `checkpoints.json`.
#[allow(dead_code)]
pub fn package_checkpoints(
    pkg: &ipu_package::Package,
) -> (ipu_graph::Graph, ipu_runtime::members::Checkpoints) {
    let graph = ipu_graph::parse(
        "model.ipug",
        std::str::from_utf8(&pkg.members["model.ipug"]).unwrap(),
    )
    .unwrap();
    let checkpoints = ipu_runtime::members::checkpoints(pkg, &graph)
        .unwrap()
        .expect("the package has checkpoints.json");
    (graph, checkpoints)
}
