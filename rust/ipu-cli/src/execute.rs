//! `ipu run`, `ipu verify` and `ipu profile`: packages on a device.

use ipu_runtime::profile::{GroupBy, Profile};
use ipu_runtime::verify::VerifyOptions;
use ipu_runtime::{DeviceOptions, DeviceSpec, FeedSpec, Generate, RunOptions};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DeviceChoice {
    /// The simulator.
    Sim,
    /// IPU hardware (/dev/ipuN).
    Hw,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Inputs {
    /// Seeded Gaussian inputs (weights scaled by 1/fan_in).
    Gaussian,
    /// The seed's constant check: inputs all ones, weights 1/fan_in.
    Constant,
}

#[derive(clap::Args)]
pub struct DeviceArgs {
    /// Which device runs the package.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Sim)]
    device: DeviceChoice,
    /// With --device hw: use the simulator when no IPU is present (and say so).
    #[arg(long)]
    fallback_sim: bool,
    /// Hardware device index.
    #[arg(long, default_value_t = 0)]
    device_index: u32,
    /// Seconds to wait for ownership of a busy device.
    #[arg(long, default_value_t = 600)]
    lock_timeout: u64,
    /// Input tensors from .npy files: NAME=FILE (others are generated).
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// How to generate inputs not given as files.
    #[arg(long, value_enum, default_value_t = Inputs::Gaussian)]
    generate: Inputs,
    /// Seed of generated Gaussian inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write an execution profile here.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// The simulator's tile memory holds NaNs (0xFF bytes) before the
    /// package loads, not zeros: a program that reads memory it neither
    /// wrote nor had its image set then computes with NaNs.
    #[arg(long)]
    poison_memory: bool,
}

impl DeviceArgs {
    fn run_options(&self, package_tiles: u32) -> Result<RunOptions, String> {
        let spec = match (self.device, self.fallback_sim) {
            (DeviceChoice::Sim, _) => DeviceSpec::Simulator {
                tiles: package_tiles,
            },
            (DeviceChoice::Hw, false) => DeviceSpec::Hardware {
                index: self.device_index,
            },
            (DeviceChoice::Hw, true) => DeviceSpec::HardwareOrSimulator {
                index: self.device_index,
            },
        };
        let mut files = BTreeMap::new();
        for input in &self.inputs {
            let (name, file) = input
                .split_once('=')
                .ok_or_else(|| format!("--input {input:?}: expected NAME=FILE"))?;
            files.insert(name.to_string(), PathBuf::from(file));
        }
        let generate = match self.generate {
            Inputs::Gaussian => Generate::Gaussian { seed: self.seed },
            Inputs::Constant => Generate::Constant,
        };
        Ok(RunOptions {
            device: DeviceOptions {
                spec,
                lock_timeout: std::time::Duration::from_secs(self.lock_timeout),
                sim_memory_fill: self.poison_memory.then_some(0xFF),
                ..DeviceOptions::default()
            },
            feeds: FeedSpec { files, generate },
            calls: Vec::new(),
            profile: self.profile.clone(),
            // A bar per call on a terminal; nothing in Bazel actions or CI.
            progress: ipu_runtime::TerminalProgress::for_stderr(),
        })
    }
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// The package (.ipupkg).
    package: PathBuf,
    #[command(flatten)]
    device: DeviceArgs,
    /// Write every output as NAME.npy here.
    #[arg(long)]
    output_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The package (.ipupkg).
    package: PathBuf,
    #[command(flatten)]
    device: DeviceArgs,
    /// Do not re-run with checkpoints to locate a failure.
    #[arg(long)]
    no_diagnose: bool,
    /// Also re-run with checkpoints when the outputs pass, and check every
    /// intermediate value the package lets the host read.
    #[arg(long)]
    checkpoints: bool,
}

#[derive(clap::Subcommand)]
pub enum ProfileCommand {
    /// Group a profile's cycles and print the top rows.
    Query {
        /// The profile (.ipuprofile) written by `ipu run --profile`.
        profile: PathBuf,
        /// Group by kernel, operation, phase, call, step or tile.
        #[arg(long, default_value = "phase")]
        by: String,
        /// Show only the largest N rows.
        #[arg(long)]
        top: Option<usize>,
    },
    /// Write a self-contained HTML view of a profile: the calls, a BSP
    /// timeline and per-tile view of every call, cycles by operation,
    /// kernel, phase and tile, memory per tile by region and category.
    Html {
        /// The profile (.ipuprofile) written by `ipu run --profile`.
        profile: PathBuf,
        /// Where to write the page (default: the profile's path with `.html`).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

fn package_tiles(path: &std::path::Path) -> Result<u32, String> {
    let package = ipu_runtime::read_package(path).map_err(|e| e.to_string())?;
    Ok(package.info.tile_count)
}

pub fn run(args: RunArgs) -> Result<(), String> {
    let options = args.device.run_options(package_tiles(&args.package)?)?;
    let report = ipu_runtime::run(&args.package, &options).map_err(|e| e.to_string())?;
    for c in &report.calls {
        println!(
            "call {}: device cycles {} host in {} host out {}",
            c.call, c.device_cycles, c.host_in_cycles, c.host_out_cycles
        );
    }
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for outputs in report.outputs.values() {
            for (name, tensor) in outputs {
                let path = dir.join(format!("{name}.npy"));
                ipu_reference::npy::write_file(&path, tensor)?;
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

pub fn verify(args: VerifyArgs) -> Result<(), String> {
    let run = args.device.run_options(package_tiles(&args.package)?)?;
    let options = VerifyOptions {
        run,
        diagnose: !args.no_diagnose,
        check_checkpoints: args.checkpoints,
    };
    let report = ipu_runtime::verify::verify(&args.package, &options).map_err(|e| e.to_string())?;
    println!("{report}");
    if report.passed() {
        Ok(())
    } else {
        Err(format!(
            "{}: numerical verification failed",
            args.package.display()
        ))
    }
}

pub fn profile(command: ProfileCommand) -> Result<(), String> {
    match command {
        ProfileCommand::Query { profile, by, top } => {
            let by: GroupBy = by.parse().map_err(|e| format!("--by: {e}"))?;
            let profile = Profile::read(&profile).map_err(|e| e.to_string())?;
            print!("{}", ipu_runtime::profile::render(&profile.query(by, top)));
            Ok(())
        }
        ProfileCommand::Html { profile, output } => {
            let output = output.unwrap_or_else(|| profile.with_extension("html"));
            if output == profile {
                return Err(format!(
                    "{}: the HTML page would replace the profile; name another --output",
                    output.display()
                ));
            }
            let page = ipu_runtime::profile::html::render_html(
                &Profile::read(&profile).map_err(|e| e.to_string())?,
            );
            write_replacing(&output, page.as_bytes())?;
            println!("wrote {} ({} bytes)", output.display(), page.len());
            Ok(())
        }
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory
/// and a rename, so that a failed write leaves any earlier file whole.
fn write_replacing(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| format!("{}: not a file path", path.display()))?;
    let temporary = dir.join(format!(".{}.partial", name.to_string_lossy()));
    std::fs::write(&temporary, bytes)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            format!("{}: {e}", path.display())
        })
}
