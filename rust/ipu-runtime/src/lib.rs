//! The ipu-stack runtime: loads a package onto a device, drives its
//! streaming calls, verifies its outputs and writes execution profiles.
//!
//! Modules, one concern each:
//! - [`device`]: the [`Device`] trait, [`SimDevice`] over `ipu_sim::Chip`, and
//!   the hardware seam ([`device::open_hardware`]) that fails with a message
//!   naming what is missing when no driver or device is present.
//! - [`lock`]: hardware ownership, an advisory `flock` held for a session.
//! - [`session`]: [`Session::load`] (validate, configure, load tiles, run to
//!   the idle host sync) and [`Session::call`] (inputs checked by name, dtype
//!   and shape; outputs read back; cycles measured).
//! - [`feeds`]: inputs from `.npy` files or generated (seeded Gaussian, constant).
//! - [`members`]: the compiler-supplied members the runtime reads
//!   (`model.ipug`, `checkpoints.json`, `schedule.json`, `symbols.json`).
//! - [`verify`]: device outputs against `ipu-reference`, with a checkpoint
//!   re-run that names the first diverging operation, its tiles and kernel.
//! - [`profile`]: the `.ipuprofile` writer and the query API.
//! - [`progress`]: a session tells a [`CallProgress`] when each call starts
//!   and ends, with the device's cycle counter; [`TerminalProgress`] draws
//!   it as a bar on stderr where stderr is a terminal (indicatif).
//!
//! Invariants: no user input (package, member, tensor file, call name)
//! makes the runtime panic; every error names the file, member, call,
//! tensor, tile or device at fault. Outputs are deterministic: the same
//! package and feeds give the same tensors, cycles, reports and profile bytes.
//!
//! API boundary: the CLI calls [`run`], [`verify::verify`] and
//! [`profile::Profile::query`]; tests and tools may drive a [`Session`]
//! directly.

pub mod device;
pub mod feeds;
pub mod lock;
pub mod members;
pub mod profile;
pub mod progress;
pub mod session;
pub mod verify;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use device::{Device, DeviceError, DeviceSpec, DeviceStop, HardwarePaths, SimDevice};
pub use feeds::{FeedSpec, Generate};
pub use lock::{DeviceLock, LockError};
pub use progress::{CallProgress, CallStart, ProgressHook, TerminalProgress};
pub use session::{CallCycles, CallOutput, Session};

use ipu_package::{Package, PackageError};
use ipu_reference::Tensor;

/// Everything that can go wrong in the runtime.
#[derive(Debug)]
pub enum RuntimeError {
    /// The package file is unreadable or invalid.
    Package {
        /// The package path.
        path: String,
        /// What the package reader found.
        error: PackageError,
    },
    /// The device failed or refused.
    Device(DeviceError),
    /// The package needs more tiles than the device has.
    TileCount {
        /// The package's tile count.
        package: u32,
        /// The device's.
        device: u32,
        /// The device.
        device_name: String,
    },
    /// No such call in the package.
    UnknownCall {
        /// The name asked for.
        name: String,
        /// The package's calls.
        known: Vec<String>,
    },
    /// A call input was not given.
    MissingInput {
        /// The call.
        call: String,
        /// The tensor.
        tensor: String,
        /// Its declared type.
        expected: String,
    },
    /// A tensor was given that the call does not take.
    UnknownInput {
        /// The call.
        call: String,
        /// The tensor given.
        tensor: String,
        /// The call's inputs.
        known: Vec<String>,
    },
    /// A call input has the wrong dtype or shape.
    InputType {
        /// The call.
        call: String,
        /// The tensor.
        tensor: String,
        /// Declared type.
        expected: String,
        /// Given type.
        given: String,
    },
    /// A compiler-supplied member is malformed.
    Member {
        /// The member name.
        member: String,
        /// What is wrong.
        message: String,
    },
    /// A profile file is malformed.
    Profile {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The device did not follow the host protocol.
    Protocol(String),
    /// An input tensor could not be read or generated.
    Feed(String),
    /// Verification could not be performed (not: verification failed).
    Verify(String),
    /// A file could not be written or read.
    Io {
        /// The path.
        path: String,
        /// What the OS said.
        error: std::io::Error,
    },
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Package { path, error } => write!(f, "package {path}: {error}"),
            RuntimeError::Device(e) => write!(f, "{e}"),
            RuntimeError::TileCount {
                package,
                device,
                device_name,
            } => write!(
                f,
                "the package uses {package} tiles but the device ({device_name}) has only {device}"
            ),
            RuntimeError::UnknownCall { name, known } => write!(
                f,
                "the package has no call `{name}` (its calls: {})",
                known.join(", ")
            ),
            RuntimeError::MissingInput {
                call,
                tensor,
                expected,
            } => write!(
                f,
                "call `{call}`: no tensor given for input `{tensor}` ({expected})"
            ),
            RuntimeError::UnknownInput {
                call,
                tensor,
                known,
            } => write!(
                f,
                "call `{call}` has no input `{tensor}` (its inputs: {})",
                known.join(", ")
            ),
            RuntimeError::InputType {
                call,
                tensor,
                expected,
                given,
            } => write!(
                f,
                "call `{call}` input `{tensor}`: expected {expected}, given {given}"
            ),
            RuntimeError::Member { member, message } => {
                write!(f, "package member {member}: {message}")
            }
            RuntimeError::Profile { path, message } => write!(f, "profile {path}: {message}"),
            RuntimeError::Protocol(why) => write!(f, "host protocol violation: {why}"),
            RuntimeError::Feed(why) => write!(f, "{why}"),
            RuntimeError::Verify(why) => write!(f, "cannot verify: {why}"),
            RuntimeError::Io { path, error } => write!(f, "{path}: {error}"),
        }
    }
}

impl std::error::Error for RuntimeError {}

impl From<DeviceError> for RuntimeError {
    fn from(e: DeviceError) -> Self {
        RuntimeError::Device(e)
    }
}

/// How to open the device and take ownership.
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// Which device.
    pub spec: DeviceSpec,
    /// A lock file to hold for the session even on the simulator (hardware
    /// always locks `<lock_dir>/ipuN.lock`).
    pub lock: Option<PathBuf>,
    /// The hardware lock directory.
    pub lock_dir: PathBuf,
    /// How long to wait for ownership.
    pub lock_timeout: Duration,
    /// Where the hardware backend looks for device nodes and drivers.
    pub hardware: HardwarePaths,
    /// The simulator only: every byte of tile memory holds this value
    /// before the package loads instead of zero ([`SimDevice::poisoned`]).
    pub sim_memory_fill: Option<u8>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            spec: DeviceSpec::HardwareOrSimulator { index: 0 },
            lock: None,
            lock_dir: DeviceLock::default_dir(),
            lock_timeout: Duration::from_secs(60),
            hardware: HardwarePaths::default(),
            sim_memory_fill: None,
        }
    }
}

impl DeviceOptions {
    /// The simulator with `tiles` tiles, no lock.
    pub fn simulator(tiles: u32) -> DeviceOptions {
        DeviceOptions {
            spec: DeviceSpec::Simulator { tiles },
            ..DeviceOptions::default()
        }
    }
}

/// Opens the device `options` describe for a package of `tile_count`
/// tiles, taking ownership as required.
pub fn open_device(
    options: &DeviceOptions,
    tile_count: u32,
) -> Result<(Box<dyn Device>, Option<DeviceLock>), RuntimeError> {
    let explicit_lock = || -> Result<Option<DeviceLock>, RuntimeError> {
        options
            .lock
            .as_ref()
            .map(|p| DeviceLock::acquire(p, options.lock_timeout))
            .transpose()
            .map_err(|e| RuntimeError::Device(DeviceError::Lock(e)))
    };
    let simulator = |tiles: u32| -> Result<Box<dyn Device>, RuntimeError> {
        tracing::info!(path = "simulator", tiles, "opening IPU device");
        Ok(Box::new(match options.sim_memory_fill {
            Some(byte) => {
                tracing::info!(
                    byte = format_args!("{byte:#04x}"),
                    "every byte of the simulated tiles' memory holds this before the package loads"
                );
                SimDevice::poisoned(tiles, byte)?
            }
            None => SimDevice::new(tiles)?,
        }))
    };
    match &options.spec {
        DeviceSpec::Simulator { tiles } => {
            let lock = explicit_lock()?;
            Ok((simulator(*tiles)?, lock))
        }
        DeviceSpec::Hardware { index } => {
            let (d, lock) = device::open_hardware(
                *index,
                &options.hardware,
                &options.lock_dir,
                options.lock_timeout,
            )?;
            Ok((d, Some(lock)))
        }
        DeviceSpec::HardwareOrSimulator { index } => {
            match device::open_hardware(
                *index,
                &options.hardware,
                &options.lock_dir,
                options.lock_timeout,
            ) {
                Ok((d, lock)) => Ok((d, Some(lock))),
                Err(e) => {
                    tracing::warn!(
                        reason = %e,
                        tiles = tile_count,
                        "IPU hardware unavailable; falling back to the simulator"
                    );
                    let lock = explicit_lock()?;
                    Ok((simulator(tile_count)?, lock))
                }
            }
        }
    }
}

/// Reads and validates a package file.
pub fn read_package(path: &Path) -> Result<Package, RuntimeError> {
    Package::read(path).map_err(|error| RuntimeError::Package {
        path: path.display().to_string(),
        error,
    })
}

/// What [`run`] does.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The device.
    pub device: DeviceOptions,
    /// Input tensors.
    pub feeds: FeedSpec,
    /// Calls to make, in order; empty = every call of the package in manifest order.
    pub calls: Vec<String>,
    /// Write an execution profile here.
    pub profile: Option<PathBuf>,
    /// Told when each call starts and ends (a progress bar).
    pub progress: Option<ProgressHook>,
}

/// What [`run`] returns.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The device used.
    pub device: String,
    /// Outputs of every call, by call then tensor name.
    pub outputs: BTreeMap<String, BTreeMap<String, Tensor>>,
    /// The tensors fed to the calls, by name.
    pub feeds: BTreeMap<String, Tensor>,
    /// Cycle figures per call.
    pub calls: Vec<CallCycles>,
    /// The profile, if requested.
    pub profile: Option<profile::Profile>,
}

/// Runs a package file: opens the device, loads, makes the calls, closes.
pub fn run(package_path: &Path, options: &RunOptions) -> Result<RunReport, RuntimeError> {
    let package = read_package(package_path)?;
    run_package(package, options)
}

/// [`run`] for a package already in memory.
pub fn run_package(package: Package, options: &RunOptions) -> Result<RunReport, RuntimeError> {
    let graph = members::model(&package)?;
    let feeds = feeds::make_feeds(&package, graph.as_ref(), &options.feeds)?;
    let calls: Vec<String> = if options.calls.is_empty() {
        package.info.calls.iter().map(|c| c.name.clone()).collect()
    } else {
        options.calls.clone()
    };
    let (device, lock) = open_device(&options.device, package.info.tile_count)?;
    let mut session = Session::load(device, package, lock)?;
    session.set_progress(options.progress.clone());
    let mut outputs = BTreeMap::new();
    for name in &calls {
        let inputs = feeds::for_call(session.package(), name, &feeds);
        let out = session.call(name, &inputs)?;
        outputs.insert(name.clone(), out.outputs);
    }
    let profile = match &options.profile {
        Some(path) => {
            let p = profile::Profile::from_session(&session)?;
            p.write(path)?;
            Some(p)
        }
        None => None,
    };
    let report = RunReport {
        device: session.device().describe(),
        outputs,
        feeds,
        calls: session.calls().to_vec(),
        profile,
    };
    session.close()?;
    Ok(report)
}
