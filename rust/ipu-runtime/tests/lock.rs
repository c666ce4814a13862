//! Hardware ownership across processes. The test binary re-executes itself
//! as the child: with `IPU_RUNTIME_LOCK_CHILD=<path>` set, the `child` test
//! takes the lock, prints a marker line, and holds it for
//! `IPU_RUNTIME_LOCK_HOLD_MS` milliseconds (or until killed).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ipu_runtime::{run, DeviceLock, DeviceOptions, FeedSpec, Generate, RunOptions};

const CHILD_ENV: &str = "IPU_RUNTIME_LOCK_CHILD";
const HOLD_ENV: &str = "IPU_RUNTIME_LOCK_HOLD_MS";

/// Not a test of its own: the body of the child process.
#[test]
fn child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let hold: u64 = std::env::var(HOLD_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600_000);
    let _lock = DeviceLock::acquire(Path::new(&path), Duration::from_secs(30)).unwrap();
    // libtest prints "test child ... " before this without a newline.
    println!("\nIPU_RUNTIME_CHILD_LOCKED");
    std::thread::sleep(Duration::from_millis(hold));
}

/// Starts a child that holds `path`, and waits until it has the lock.
fn spawn_owner(path: &Path, hold_ms: u64) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, path)
        .env(HOLD_ENV, hold_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("the child exited without taking the lock");
        }
        if line.trim() == "IPU_RUNTIME_CHILD_LOCKED" {
            break;
        }
    }
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    child
}

#[test]
fn a_second_process_times_out_naming_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipu0.lock");
    let mut owner = spawn_owner(&path, 600_000);
    let start = Instant::now();
    let e = DeviceLock::acquire(&path, Duration::from_millis(300)).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        e.to_string(),
        format!(
            "timed out after {:.1} s waiting for hardware ownership: {} is held by process {}",
            match &e {
                ipu_runtime::LockError::Timeout { waited, .. } => waited.as_secs_f64(),
                _ => unreachable!(),
            },
            path.display(),
            owner.id()
        )
    );
    owner.kill().unwrap();
    owner.wait().unwrap();
}

#[test]
fn a_killed_owner_never_leaves_the_lock_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipu0.lock");
    let mut owner = spawn_owner(&path, 600_000);
    assert!(DeviceLock::acquire(&path, Duration::from_millis(50)).is_err());
    // SIGKILL: no destructor runs; the kernel drops the flock.
    owner.kill().unwrap();
    owner.wait().unwrap();
    let lock = DeviceLock::acquire(&path, Duration::from_secs(5)).unwrap();
    assert_eq!(lock.path(), path);
}

#[test]
fn a_waiting_session_runs_once_the_owner_releases() {
    let dir = tempfile::tempdir().unwrap();
    let package = common::write(
        dir.path(),
        "p.ipupkg",
        &common::package(common::Options::default()),
    );
    let path = dir.path().join("sim.lock");
    let mut owner = spawn_owner(&path, 400);
    let start = Instant::now();
    let options = RunOptions {
        device: DeviceOptions {
            lock: Some(path.clone()),
            lock_timeout: Duration::from_secs(20),
            ..DeviceOptions::simulator(2)
        },
        feeds: FeedSpec {
            generate: Generate::Constant,
            ..FeedSpec::default()
        },
        ..RunOptions::default()
    };
    let report = run(&package, &options).unwrap();
    // It had to wait for the owner's remaining hold time.
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert!(report.outputs["run"]["z"].data().iter().all(|&v| v == 3.0));
    owner.wait().unwrap();
    // And the session released the lock when it ended.
    DeviceLock::acquire(&path, Duration::ZERO).unwrap();
}
