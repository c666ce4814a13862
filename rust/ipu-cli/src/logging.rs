//! Logging setup: tracing-subscriber filtered by RUST_LOG, as text or JSON,
//! to stderr or to a file (Bazel actions keep the compiler's log as an output).

use std::path::Path;
use std::sync::Mutex;
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, like the seed log.
    Text,
    /// One JSON object a line.
    Json,
}

pub fn init(format: LogFormat, file: Option<&Path>) -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(path) => {
            let file = std::fs::File::create(path)
                .map_err(|e| format!("--log-file {}: {e}", path.display()))?;
            let builder = builder.with_ansi(false).with_writer(Mutex::new(file));
            match format {
                LogFormat::Text => builder.init(),
                LogFormat::Json => builder.json().init(),
            }
        }
        None => {
            let builder = builder.with_writer(std::io::stderr);
            match format {
                LogFormat::Text => builder.init(),
                LogFormat::Json => builder.json().init(),
            }
        }
    }
    Ok(())
}
