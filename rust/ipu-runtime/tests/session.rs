//! Loading and calls on the simulator with hand-built packages: outputs,
//! cycle accounting, input checking, tile counts, corrupt packages, the
//! hardware seam's messages and the fallback.

mod common;

use std::collections::BTreeMap;

use ipu_graph::{DType, Shape, TensorType};
use ipu_reference::Tensor;
use ipu_runtime::{
    open_device, run, DeviceOptions, DeviceSpec, FeedSpec, Generate, HardwarePaths, RunOptions,
    Session, SimDevice,
};

fn f32_tensor(dims: &[usize], f: impl Fn(usize) -> f64) -> Tensor {
    let n: usize = dims.iter().product();
    let data: Vec<f64> = (0..n).map(|i| f(i) as f32 as f64).collect();
    Tensor::new(DType::F32, Shape::new(dims.to_vec()), data).unwrap()
}

fn one(name: &str, t: Tensor) -> BTreeMap<String, Tensor> {
    BTreeMap::from([(name.to_string(), t)])
}

fn load(o: common::Options, tiles: u32) -> Result<Session, ipu_runtime::RuntimeError> {
    Session::load(
        Box::new(SimDevice::new(tiles).unwrap()),
        common::package(o),
        None,
    )
}

#[test]
fn calls_compute_on_the_simulator_and_report_cycles() {
    let mut s = load(common::Options::default(), 2).unwrap();
    let b = f32_tensor(&[2, 8], |i| 0.25 * i as f64 - 1.0);
    let x = f32_tensor(&[2, 8], |i| 1.0 / (i as f64 + 3.0));
    let init = s.call("initialize", &one("b", b.clone())).unwrap();
    assert!(init.outputs.is_empty());
    assert_eq!(init.cycles.steps(), 1);
    let out = s.call("run", &one("x", x.clone())).unwrap();
    let z = &out.outputs["z"];
    // The expected values, in f32 arithmetic as the kernel's f32v2add rounds.
    for i in 0..16 {
        let y = (x.data()[i] as f32) + (b.data()[i] as f32);
        assert_eq!(z.data()[i], (y + y) as f64, "element {i}");
    }
    // Two BSP steps: `sync` after y, final `hsync` after z.
    assert_eq!(out.cycles.steps(), 2);
    assert!(out.cycles.device_cycles > 2 * ipu_arch::SYNC_CYCLES);
    // 64 input bytes + 2 command words; 64 output bytes.
    assert_eq!(
        out.cycles.host_in_cycles,
        ipu_arch::host_transfer_cycles(72, ipu_arch::CLOCK_HZ_C600)
    );
    assert_eq!(
        out.cycles.host_out_cycles,
        ipu_arch::host_transfer_cycles(64, ipu_arch::CLOCK_HZ_C600)
    );
    // A second run on the same session gives the same result; its cycles
    // may differ by less than one issue round, because the resume cycle's
    // position among the six issue slots differs.
    let again = s.call("run", &one("x", x)).unwrap();
    assert_eq!(again.outputs["z"], *z);
    assert!(
        again
            .cycles
            .device_cycles
            .abs_diff(out.cycles.device_cycles)
            < 6
    );
    s.close().unwrap();
}

/// A poisoned simulator (`--poison-memory`) holds the byte everywhere the
/// package image does not write, and the hand-built package, which reads
/// only what it writes or its image sets, computes the same outputs on it.
#[test]
fn a_poisoned_simulator_holds_its_byte_where_the_image_writes_nothing() {
    use ipu_runtime::Device;
    let mut fresh = SimDevice::poisoned(2, 0xFF).unwrap();
    let sram = (ipu_arch::SRAM_END - ipu_arch::SRAM_BASE) as usize;
    for tile in 0..2 {
        let all = fresh.read(tile, ipu_arch::SRAM_BASE, sram as u32).unwrap();
        assert!(all.iter().all(|&b| b == 0xFF), "tile {tile}");
    }
    let package = common::package(common::Options::default());
    let image_bytes: usize = package.tiles[&0]
        .segments
        .iter()
        .map(|s| s.bytes.len())
        .sum();
    let mut poisoned = Session::load(
        Box::new(SimDevice::poisoned(2, 0xFF).unwrap()),
        package,
        None,
    )
    .unwrap();
    let mut clean = load(common::Options::default(), 2).unwrap();
    let b = f32_tensor(&[2, 8], |i| 0.5 * i as f64 - 2.0);
    let x = f32_tensor(&[2, 8], |i| 1.0 / (i as f64 + 1.0));
    for s in [&mut poisoned, &mut clean] {
        s.call("initialize", &one("b", b.clone())).unwrap();
    }
    let got = poisoned.call("run", &one("x", x.clone())).unwrap();
    let want = clean.call("run", &one("x", x)).unwrap();
    assert_eq!(got.outputs, want.outputs);
    // The image covers a small part of the tile; the rest kept the byte.
    assert!(image_bytes < sram / 2);
    poisoned.close().unwrap();
    clean.close().unwrap();
}

#[test]
fn configuration_writes_are_replayed() {
    let mut device = SimDevice::new(2).unwrap();
    device
        .configure(
            &common::package(common::Options::default())
                .info
                .config_writes,
        )
        .unwrap();
    assert_eq!(
        device
            .registers()
            .get(&(None, "exchange_clock_divider".to_string())),
        Some(&1)
    );
    let bad = [ipu_package::ConfigWrite {
        tile: Some(5),
        register: "r".to_string(),
        value: 0,
    }];
    use ipu_runtime::Device;
    let e = device.configure(&bad).unwrap_err();
    assert_eq!(
        e.to_string(),
        "configuration write 0 (r) targets tile 5, but the device has 2 tiles"
    );
}

#[test]
fn input_names_dtypes_and_shapes_are_checked() {
    let mut s = load(common::Options::default(), 2).unwrap();
    let good = f32_tensor(&[2, 8], |_| 1.0);
    let cases: Vec<(&str, BTreeMap<String, Tensor>, &str)> = vec![
        (
            "run",
            one("x", f32_tensor(&[2, 4], |_| 1.0)),
            "call `run` input `x`: expected f32[2, 8], given f32[2, 4]",
        ),
        (
            "run",
            one(
                "x",
                Tensor::filled(&TensorType::new(DType::F16, vec![2, 8]), 1.0),
            ),
            "call `run` input `x`: expected f32[2, 8], given f16[2, 8]",
        ),
        (
            "run",
            BTreeMap::new(),
            "call `run`: no tensor given for input `x` (f32[2, 8])",
        ),
        (
            "run",
            BTreeMap::from([
                ("x".to_string(), good.clone()),
                ("w".to_string(), good.clone()),
            ]),
            "call `run` has no input `w` (its inputs: x)",
        ),
        (
            "infer",
            BTreeMap::new(),
            "the package has no call `infer` (its calls: initialize, run)",
        ),
    ];
    for (call, inputs, message) in cases {
        let e = s.call(call, &inputs).unwrap_err();
        assert_eq!(e.to_string(), message);
    }
    // Nothing was sent: the session still works.
    s.call("initialize", &one("b", good.clone())).unwrap();
    s.call("run", &one("x", good)).unwrap();
}

#[test]
fn a_package_larger_than_the_device_is_refused() {
    let e = load(common::Options::default(), 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the package uses 2 tiles but the device (simulator ipu21 tiles=1) has only 1"
    );
    // A larger device is fine: the package uses tiles 0..2.
    load(common::Options::default(), 8).unwrap();
}

#[test]
fn corrupt_and_truncated_packages_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write(
        dir.path(),
        "good.ipupkg",
        &common::package(common::Options::default()),
    );
    let bytes = std::fs::read(&path).unwrap();
    let options = RunOptions {
        device: DeviceOptions::simulator(2),
        ..RunOptions::default()
    };
    run(&path, &options).unwrap();
    let bad = dir.path().join("bad.ipupkg");
    let mut rng = ipu_rng::SplitMix64(0x1234_5678_9abc_def0);
    let mut next = || rng.next_u64();
    for round in 0..60 {
        let mut b = bytes.clone();
        if round % 2 == 0 {
            b.truncate((next() % bytes.len() as u64) as usize);
        } else {
            let i = (next() % b.len() as u64) as usize;
            b[i] ^= 1 << (next() % 8);
        }
        std::fs::write(&bad, &b).unwrap();
        let e = run(&bad, &options).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("package {}: ", bad.display())),
            "round {round}: {e}"
        );
    }
    let missing = dir.path().join("missing.ipupkg");
    let e = run(&missing, &options).unwrap_err().to_string();
    assert!(
        e.contains("missing.ipupkg") && e.contains("No such file"),
        "{e}"
    );
}

#[test]
fn malformed_runtime_members_name_the_member_and_entry() {
    let mut p = common::package(common::Options::default());
    p.members.insert(
        "checkpoints.json".to_string(),
        br#"{"format_version": 1, "calls": [{"call": "run", "stops": 1, "values": [{"value": "q", "stop": 1, "placements": []}]}]}"#.to_vec(),
    );
    let e = ipu_runtime::verify::verify_package(p, &ipu_runtime::verify::VerifyOptions::default())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "package member checkpoints.json: call `run` value `q`: no such value in model.ipug"
    );
    let mut p = common::package(common::Options::default());
    p.members.insert(
        "checkpoints.json".to_string(),
        br#"{"format_version": 1, "calls": [{"call": "run", "stops": 1, "values": [{"value": "y", "stop": 1, "placements": [{"tile": 0, "address": 524288, "offset": 0, "bytes": 32}]}]}]}"#.to_vec(),
    );
    let e = ipu_runtime::verify::verify_package(p, &ipu_runtime::verify::VerifyOptions::default())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "package member checkpoints.json: call `run` value `y`: bytes 32..64 are placed on no tile"
    );
    let mut p = common::package(common::Options::default());
    p.members.insert(
        "symbols.json".to_string(),
        b"{\"format_version\": 2, \"groups\": []}".to_vec(),
    );
    let e = load_package(p).unwrap_err();
    assert_eq!(
        e.to_string(),
        "package member symbols.json: unsupported format_version 2 (expected 1)"
    );
    let mut p = common::package(common::Options::default());
    p.members.insert(
        "model.ipug".to_string(),
        b"model m\ninput x: f32[2]\noutput y\n".to_vec(),
    );
    let e = ipu_runtime::verify::verify_package(p, &ipu_runtime::verify::VerifyOptions::default())
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("package member model.ipug: model.ipug:3:"),
        "{e}"
    );
}

fn load_package(p: ipu_package::Package) -> Result<Session, ipu_runtime::RuntimeError> {
    Session::load(Box::new(SimDevice::new(2).unwrap()), p, None)
}

#[test]
fn hardware_without_driver_or_device_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HardwarePaths {
        dev_dir: dir.path().join("dev"),
        driver_dir: dir.path().join("sys/class/ipu"),
    };
    let options = DeviceOptions {
        spec: DeviceSpec::Hardware { index: 3 },
        lock_dir: dir.path().join("locks"),
        hardware: paths.clone(),
        ..DeviceOptions::default()
    };
    let e = open_device(&options, 2).err().unwrap().to_string();
    assert_eq!(
        e,
        format!(
            "cannot open IPU device {}/dev/ipu3: no such device node, and the IPU kernel driver is not loaded ({}/sys/class/ipu does not exist)",
            dir.path().display(),
            dir.path().display()
        )
    );
    // With a driver directory but no node.
    std::fs::create_dir_all(&paths.driver_dir).unwrap();
    let e = open_device(&options, 2).err().unwrap().to_string();
    assert!(
        e.contains("no such device node (the IPU driver is loaded"),
        "{e}"
    );
    // With both: this build has no driver interface, and says so.
    std::fs::create_dir_all(&paths.dev_dir).unwrap();
    std::fs::write(paths.dev_dir.join("ipu3"), b"").unwrap();
    let e = open_device(&options, 2).err().unwrap().to_string();
    assert!(e.contains("has no IPU driver interface"), "{e}");
}

#[test]
fn hardware_or_simulator_falls_back_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write(
        dir.path(),
        "p.ipupkg",
        &common::package(common::Options::default()),
    );
    let options = RunOptions {
        device: DeviceOptions {
            spec: DeviceSpec::HardwareOrSimulator { index: 0 },
            lock_dir: dir.path().join("locks"),
            hardware: HardwarePaths {
                dev_dir: dir.path().join("dev"),
                driver_dir: dir.path().join("sys"),
            },
            ..DeviceOptions::default()
        },
        feeds: FeedSpec {
            files: BTreeMap::new(),
            generate: Generate::Fill { value: 1.5 },
        },
        ..RunOptions::default()
    };
    let report = run(&path, &options).unwrap();
    assert_eq!(report.device, "simulator ipu21 tiles=2");
    // z = 2 * (1.5 + 1.5) everywhere.
    assert!(report.outputs["run"]["z"].data().iter().all(|&v| v == 6.0));
    assert_eq!(
        report
            .calls
            .iter()
            .map(|c| c.call.as_str())
            .collect::<Vec<_>>(),
        ["initialize", "run"]
    );
}

#[test]
fn npy_inputs_are_read_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write(
        dir.path(),
        "p.ipupkg",
        &common::package(common::Options::default()),
    );
    let x = f32_tensor(&[2, 8], |i| i as f64);
    let xp = dir.path().join("x.npy");
    ipu_reference::npy::write_file(&xp, &x).unwrap();
    let bp = dir.path().join("b.npy");
    ipu_reference::npy::write_file(&bp, &f32_tensor(&[2, 8], |_| 0.5)).unwrap();
    let mut options = RunOptions {
        device: DeviceOptions::simulator(2),
        feeds: FeedSpec {
            files: BTreeMap::from([("x".to_string(), xp), ("b".to_string(), bp.clone())]),
            generate: Generate::None,
        },
        ..RunOptions::default()
    };
    let report = run(&path, &options).unwrap();
    let z = &report.outputs["run"]["z"];
    assert_eq!(z.data()[5], 2.0 * 5.5);
    // A file of the wrong shape names the call, tensor and types.
    let wrong = dir.path().join("wrong.npy");
    ipu_reference::npy::write_file(&wrong, &f32_tensor(&[16], |_| 0.0)).unwrap();
    options.feeds.files.insert("x".to_string(), wrong);
    let e = run(&path, &options).unwrap_err().to_string();
    assert!(e.starts_with("call `run` input `x` (f32[2, 8]): "), "{e}");
    // Without generation, a tensor with no file is an error.
    options.feeds.files.remove("x");
    let e = run(&path, &options).unwrap_err().to_string();
    assert_eq!(
        e,
        "call `run` input `x` (f32[2, 8]): no .npy file given and generation is off"
    );
}

#[test]
fn device_faults_name_tile_and_symbol() {
    // A package whose `run` reads through a bad pointer: the vertex state of
    // y points outside SRAM.
    let mut p = common::package(common::Options::default());
    for image in p.tiles.values_mut() {
        for seg in &mut image.segments {
            if seg.address == 0x80100 {
                seg.bytes[0..4].copy_from_slice(&0x10u32.to_le_bytes());
            }
        }
    }
    let mut s = load_package(p).unwrap();
    s.call("initialize", &one("b", f32_tensor(&[2, 8], |_| 0.0)))
        .unwrap();
    let e = s
        .call("run", &one("x", f32_tensor(&[2, 8], |_| 0.0)))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("device fault: tile 0, worker 0, pc 0x"),
        "{e}"
    );
    assert!(e.contains("<add_f32+0x"), "{e}");
    assert!(e.contains("outside tile SRAM"), "{e}");
}

/// Records what a session tells its progress hook.
#[derive(Default)]
struct Recorded {
    events: std::sync::Mutex<Vec<(String, String, u64)>>,
    counter: std::sync::Mutex<Option<(u64, std::sync::Arc<std::sync::atomic::AtomicU64>)>>,
}

impl ipu_runtime::CallProgress for Recorded {
    fn started(&self, c: ipu_runtime::CallStart<'_>) {
        self.events
            .lock()
            .unwrap()
            .push(("started".into(), c.call.into(), c.start));
        *self.counter.lock().unwrap() = Some((c.start, c.reached.expect("the simulator counts")));
    }

    fn finished(&self, call: &str) {
        let (start, reached) = self.counter.lock().unwrap().take().unwrap();
        let at = reached.load(std::sync::atomic::Ordering::Relaxed);
        self.events
            .lock()
            .unwrap()
            .push(("finished".into(), call.into(), at - start));
    }
}

#[test]
fn progress_hooks_see_each_call_and_its_device_cycles() {
    let recorded = std::sync::Arc::new(Recorded::default());
    let options = RunOptions {
        device: DeviceOptions::simulator(2),
        progress: Some(ipu_runtime::ProgressHook(recorded.clone())),
        ..RunOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = common::write(
        dir.path(),
        "p.ipupkg",
        &common::package(common::Options::default()),
    );
    let report = run(&path, &options).unwrap();
    let events = recorded.events.lock().unwrap().clone();
    assert_eq!(events.len(), 2 * report.calls.len(), "{events:?}");
    for (pair, call) in events.chunks(2).zip(&report.calls) {
        assert_eq!(pair[0].0, "started");
        assert_eq!(pair[1].0, "finished");
        assert_eq!((&pair[0].1, &pair[1].1), (&call.call, &call.call));
        // The counter has reached the call's end: its device cycles past
        // where its inputs' host-link cycles end.
        assert_eq!(pair[1].2, call.device_cycles, "{}", call.call);
    }
}
