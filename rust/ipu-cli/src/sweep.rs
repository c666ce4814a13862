//! `ipu sweep-report -o OUT NAME=REPORT...`: tabulates the compile reports of
//! a package family (Bazel's ipu_sweep) as a Markdown table.

use std::fmt::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct SweepReportArgs {
    /// Where to write the table.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Variant name and its compile report (report.json), as NAME=PATH.
    #[arg(required = true, value_name = "NAME=REPORT")]
    reports: Vec<String>,
}

pub fn run(args: SweepReportArgs) -> Result<(), String> {
    let mut table = String::from(
        "| variant | tiles | estimated cycles | compute bound | ratio | peak standard B | peak interleaved B |\n|---|---|---|---|---|---|---|\n",
    );
    for entry in &args.reports {
        let (name, path) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?}: expected NAME=REPORT"))?;
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let report: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{path}: not JSON: {e}"))?;
        let number = |key: &str| -> Result<u64, String> {
            report
                .get(key)
                .and_then(|v| v.as_u64().or_else(|| v.get("run").and_then(|r| r.as_u64())))
                .ok_or_else(|| format!("{path}: the report has no number `{key}`"))
        };
        let estimated = number("estimated_cycles")?;
        let bound = number("compute_bound_cycles")?.max(1);
        let _ = writeln!(
            table,
            "| {name} | {} | {estimated} | {bound} | {:.2} | {} | {} |",
            number("tile_count")?,
            estimated as f64 / bound as f64,
            number("peak_standard_bytes")?,
            number("peak_interleaved_bytes")?,
        );
    }
    ipu_object::write_atomic(&args.output, table.as_bytes())
        .map_err(|e| format!("{}: cannot write: {e}", args.output.display()))
}
