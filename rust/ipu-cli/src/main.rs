//! `ipu`: the command-line front end of ipu-stack.
//!
//! Each subcommand is a thin shell over a library crate; the crates hold the
//! logic so that Bazel rules, tests and this command share one implementation.
//! Logging goes to stderr through tracing: RUST_LOG selects what is shown
//! (default `info`), and `--log-format json` writes one JSON object a line for
//! machines.

mod compile;
mod execute;
mod logging;
mod machine;
mod object;
mod sim;
mod sweep;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ipu",
    version,
    about = "Compile, simulate, run and verify ipu21 application packages"
)]
struct Cli {
    /// How log lines are written to stderr.
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text)]
    log_format: logging::LogFormat,

    /// Write the log to this file instead of stderr.
    #[arg(long, global = true)]
    log_file: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the ipu21 machine model: tiles, memory map, rates and ceilings.
    Machine(machine::MachineArgs),
    /// Inspect kernel objects and tile images.
    #[command(subcommand)]
    Object(object::ObjectCommand),
    /// Run a linked tile image on the simulator (no package, no host).
    Sim(sim::SimArgs),
    /// Compile a model (.ipug) into an application package.
    Compile(compile::CompileArgs),
    /// Run a package's calls on a device; optionally save outputs as .npy.
    Run(execute::RunArgs),
    /// Run a package and check its outputs against the host reference.
    Verify(execute::VerifyArgs),
    /// Query execution profiles.
    #[command(subcommand)]
    Profile(execute::ProfileCommand),
    /// Tabulate the compile reports of a package sweep (used by ipu_sweep).
    SweepReport(sweep::SweepReportArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(message) = logging::init(cli.log_format, cli.log_file.as_deref()) {
        eprintln!("error: {message}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Machine(args) => machine::run(args),
        Command::Object(command) => object::run(command),
        Command::Sim(args) => sim::run(args),
        Command::Compile(args) => compile::run(args),
        Command::Run(args) => execute::run(args),
        Command::Verify(args) => execute::verify(args),
        Command::Profile(command) => execute::profile(command),
        Command::SweepReport(args) => sweep::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
