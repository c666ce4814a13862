//! The device seam: what a session needs from a device, the simulator
//! implementation, and the hardware backend's opening checks.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use ipu_package::ConfigWrite;
use ipu_sim::{Chip, ChipConfig, SimError, StepRecord, Stop, SymbolMap};

use crate::lock::{DeviceLock, LockError};

/// Why a device operation failed.
#[derive(Debug)]
pub enum DeviceError {
    /// The device cannot be opened; `missing` says what is absent.
    Unavailable {
        /// The device, e.g. `/dev/ipu0`.
        device: String,
        /// What is missing, in a sentence.
        missing: String,
    },
    /// Ownership could not be taken.
    Lock(LockError),
    /// The simulated chip faulted (the error names tile, pc, symbol, step).
    Fault(SimError),
    /// A request the device refuses (tile out of range, bad register write).
    Refused(String),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Unavailable { device, missing } => {
                write!(f, "cannot open IPU device {device}: {missing}")
            }
            DeviceError::Lock(e) => write!(f, "{e}"),
            DeviceError::Fault(e) => write!(f, "device fault: {e}"),
            DeviceError::Refused(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for DeviceError {}

impl From<SimError> for DeviceError {
    fn from(e: SimError) -> Self {
        DeviceError::Fault(e)
    }
}

/// Why [`Device::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceStop {
    /// Every tile is at a host sync; the host may read and write memory.
    HostSync,
    /// Every tile has exited.
    Exited,
}

/// What the session drives. Implementations: [`SimDevice`] (the ipu21
/// simulator) and, behind [`open_hardware`], the hardware seam.
pub trait Device: Send {
    /// A short description for logs, e.g. `simulator ipu21 tiles=1472`.
    fn describe(&self) -> String;
    /// Tiles on the device.
    fn tile_count(&self) -> u32;
    /// Replays configuration register writes, in order.
    fn configure(&mut self, writes: &[ConfigWrite]) -> Result<(), DeviceError>;
    /// Writes bytes into tile memory.
    fn write(&mut self, tile: u32, address: u32, bytes: &[u8]) -> Result<(), DeviceError>;
    /// Reads bytes from tile memory.
    fn read(&mut self, tile: u32, address: u32, len: u32) -> Result<Vec<u8>, DeviceError>;
    /// Sets a tile's supervisor entry point.
    fn set_entry(&mut self, tile: u32, pc: u32) -> Result<(), DeviceError>;
    /// Supplies code symbols of a tile (used in fault messages).
    fn set_symbols(&mut self, _tile: u32, _symbols: Arc<SymbolMap>) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Runs until every tile reaches a host sync or exits.
    fn run(&mut self) -> Result<DeviceStop, DeviceError>;
    /// Device cycles so far.
    fn cycles(&self) -> u64;
    /// Per-tile counters of every completed BSP step.
    fn steps(&self) -> &[StepRecord];
    /// The clock used to convert host link bytes into cycles.
    fn clock_hz(&self) -> u64;
    /// A counter of the device cycles reached so far that another thread
    /// may read while [`Device::run`] runs (progress), if the device keeps one.
    fn progress(&self) -> Option<Arc<AtomicU64>> {
        None
    }
}

/// The simulator as a device.
pub struct SimDevice {
    chip: Chip,
    /// Configuration writes replayed so far: the simulator has no
    /// configuration registers, so they are recorded (and range-checked).
    registers: BTreeMap<(Option<u32>, String), u32>,
    writes_replayed: usize,
}

impl SimDevice {
    /// A simulated ipu21 with `tiles` tiles (1..=1472).
    pub fn new(tiles: u32) -> Result<SimDevice, DeviceError> {
        Self::with_config(ChipConfig {
            tiles,
            ..ChipConfig::default()
        })
    }

    /// A simulated ipu21 with `tiles` tiles whose memory holds `byte` in
    /// every address instead of zero before anything is written: 0xFF makes
    /// every f16 and f32 a NaN, so that a program reading memory it
    /// neither wrote nor had the package image set computes with NaNs
    /// where fresh zeros would hide it (a package's zero-at-load ranges
    /// are image contents and are written).
    pub fn poisoned(tiles: u32, byte: u8) -> Result<SimDevice, DeviceError> {
        let mut device = Self::new(tiles)?;
        let sram = vec![byte; (ipu_arch::SRAM_END - ipu_arch::SRAM_BASE) as usize];
        for tile in 0..tiles {
            device.write(tile, ipu_arch::SRAM_BASE, &sram)?;
        }
        Ok(device)
    }

    /// A simulator with explicit settings.
    pub fn with_config(config: ChipConfig) -> Result<SimDevice, DeviceError> {
        Ok(SimDevice {
            chip: Chip::try_new(config).map_err(DeviceError::Refused)?,
            registers: BTreeMap::new(),
            writes_replayed: 0,
        })
    }

    /// The configuration registers as replayed: (tile or chip, name) -> value.
    pub fn registers(&self) -> &BTreeMap<(Option<u32>, String), u32> {
        &self.registers
    }

    /// The underlying chip (profilers and debuggers peek through it).
    pub fn chip(&self) -> &Chip {
        &self.chip
    }
}

impl Device for SimDevice {
    fn describe(&self) -> String {
        format!("simulator ipu21 tiles={}", self.chip.tile_count())
    }

    fn tile_count(&self) -> u32 {
        self.chip.tile_count()
    }

    fn configure(&mut self, writes: &[ConfigWrite]) -> Result<(), DeviceError> {
        for (i, w) in writes.iter().enumerate() {
            if let Some(t) = w.tile {
                if t >= self.chip.tile_count() {
                    return Err(DeviceError::Refused(format!(
                        "configuration write {i} ({}) targets tile {t}, but the device has {} tiles",
                        w.register,
                        self.chip.tile_count()
                    )));
                }
            }
            self.registers.insert((w.tile, w.register.clone()), w.value);
            self.writes_replayed += 1;
        }
        Ok(())
    }

    fn write(&mut self, tile: u32, address: u32, bytes: &[u8]) -> Result<(), DeviceError> {
        Ok(self.chip.write(tile, address, bytes)?)
    }

    fn read(&mut self, tile: u32, address: u32, len: u32) -> Result<Vec<u8>, DeviceError> {
        Ok(self.chip.read(tile, address, len)?)
    }

    fn set_entry(&mut self, tile: u32, pc: u32) -> Result<(), DeviceError> {
        Ok(self.chip.set_entry(tile, pc)?)
    }

    fn set_symbols(&mut self, tile: u32, symbols: Arc<SymbolMap>) -> Result<(), DeviceError> {
        Ok(self.chip.set_symbols(tile, symbols)?)
    }

    fn run(&mut self) -> Result<DeviceStop, DeviceError> {
        Ok(match self.chip.run()? {
            Stop::HostSync => DeviceStop::HostSync,
            Stop::Exited => DeviceStop::Exited,
        })
    }

    fn cycles(&self) -> u64 {
        self.chip.cycles()
    }

    fn steps(&self) -> &[StepRecord] {
        self.chip.steps()
    }

    fn clock_hz(&self) -> u64 {
        ipu_arch::CLOCK_HZ_C600
    }

    fn progress(&self) -> Option<Arc<AtomicU64>> {
        Some(self.chip.progress())
    }
}

/// Which device to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The simulator with this many tiles.
    Simulator {
        /// Tiles (1..=1472).
        tiles: u32,
    },
    /// Hardware device `/dev/ipu<index>`; failure is an error.
    Hardware {
        /// Device index.
        index: u32,
    },
    /// Hardware device `/dev/ipu<index>`, or the simulator (with the
    /// package's tile count) when the hardware cannot be opened.
    HardwareOrSimulator {
        /// Device index.
        index: u32,
    },
}

/// Where the hardware backend looks for devices and drivers. Tests point it
/// at a temporary directory.
#[derive(Clone, Debug)]
pub struct HardwarePaths {
    /// Directory of device nodes (`/dev`).
    pub dev_dir: PathBuf,
    /// The driver's sysfs class directory (`/sys/class/ipu`).
    pub driver_dir: PathBuf,
}

impl Default for HardwarePaths {
    fn default() -> Self {
        HardwarePaths {
            dev_dir: PathBuf::from("/dev"),
            driver_dir: PathBuf::from("/sys/class/ipu"),
        }
    }
}

/// Opens hardware device `index`: checks for the device node and the driver
/// and takes ownership. This build contains no driver interface, so even
/// when both exist the open fails, saying so; it never pretends to drive a chip.
pub fn open_hardware(
    index: u32,
    paths: &HardwarePaths,
    lock_dir: &Path,
    lock_timeout: Duration,
) -> Result<(Box<dyn Device>, DeviceLock), DeviceError> {
    let node = paths.dev_dir.join(format!("ipu{index}"));
    let device = node.display().to_string();
    tracing::info!(path = %device, "opening IPU device");
    let node_present = node.exists();
    let driver_present = paths.driver_dir.is_dir();
    let missing = match (node_present, driver_present) {
        (false, false) => Some(format!(
            "no such device node, and the IPU kernel driver is not loaded ({} does not exist)",
            paths.driver_dir.display()
        )),
        (false, true) => Some(format!(
            "no such device node (the IPU driver is loaded: {} exists, but it has no device {index})",
            paths.driver_dir.display()
        )),
        (true, false) => Some(format!(
            "the device node exists but the IPU kernel driver is not loaded ({} does not exist)",
            paths.driver_dir.display()
        )),
        (true, true) => None,
    };
    if let Some(missing) = missing {
        return Err(DeviceError::Unavailable { device, missing });
    }
    // Take ownership before touching the device, as a real backend would.
    let lock = DeviceLock::acquire(&DeviceLock::path_for_device(lock_dir, index), lock_timeout)
        .map_err(DeviceError::Lock)?;
    drop(lock);
    Err(DeviceError::Unavailable {
        device,
        missing:
            "this build of ipu-runtime has no IPU driver interface (the hardware backend is a seam \
                  for a vendor driver binding); use the simulator"
                .to_string(),
    })
}
