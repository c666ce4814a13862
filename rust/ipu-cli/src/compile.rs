//! `ipu compile MODEL -o PKG`: the graph compiler's front end.

use ipu_compiler::{
    Accumulation, CompileOptions, HostInputs, KernelSource, RepeatLowering, SearchBudget,
};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CompileArgs {
    /// The model (.ipug).
    model: PathBuf,
    /// Where to write the package.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Tiles the package may use.
    #[arg(long, default_value_t = ipu_arch::TILES_PER_CHIP)]
    tiles: u32,
    /// A kernel library index written by Bazel's ipu_kernel_library. Without
    /// it, kernels are assembled from --device-dir through the kernel cache.
    #[arg(long)]
    kernel_library: Option<PathBuf>,
    /// Kernel sources, used when no --kernel-library is given.
    #[arg(long, default_value = "device")]
    device_dir: PathBuf,
    /// Also write the compile report (JSON) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Planner options as KEY=VALUE: beam_width, finalists, max_candidates,
    /// accumulation (auto, f16, f32), attention_layout (auto, rows, columns),
    /// attention_merge (auto; accumulate: row plans of attention whose
    /// P V accumulates into O, no merge step; merge: only plans with it),
    /// stream_b (auto, homes, resident: where a streamed GEMM's B lives),
    /// host_inputs (once: an input the program holds more than once is
    /// written once and copied on the device; replicated: the host writes
    /// every copy), repeat (loop: a `repeat` block compiled once and run
    /// as a device loop; expand: every iteration compiled on its own),
    /// loop_weights (auto, stack: every iteration's weights stacked on the
    /// chip; stream: the host writes each iteration's weights at a host
    /// stop).
    #[arg(long = "option", value_name = "KEY=VALUE")]
    options: Vec<String>,
}

pub fn run(args: CompileArgs) -> Result<(), String> {
    let kernels = match args.kernel_library {
        Some(index) => KernelSource::Index(index),
        None => KernelSource::Sources {
            device_dir: args.device_dir,
            cache_dir: None,
        },
    };
    let mut options = CompileOptions::new(&args.model, args.tiles, kernels);
    options.output = Some(args.output.clone());
    apply_options(&mut options, &args.options)?;
    let output = ipu_compiler::compile(&options).map_err(|e| e.to_string())?;
    if let Some(path) = &args.report {
        let text = serde_json::to_string_pretty(&output.report).map_err(|e| e.to_string())? + "\n";
        ipu_object::write_atomic(path, text.as_bytes())
            .map_err(|e| format!("{}: cannot write: {e}", path.display()))?;
    }
    tracing::info!(
        package = %args.output.display(),
        estimated_run_cycles = output.estimated_run_cycles,
        estimated_compute_cycles = output.estimated_compute_cycles,
        "package written"
    );
    Ok(())
}

fn apply_options(compile: &mut CompileOptions, options: &[String]) -> Result<(), String> {
    let search: &mut SearchBudget = &mut compile.search;
    let accumulation: &mut Accumulation = &mut compile.accumulation;
    let attention_layout = &mut compile.attention_layout;
    let host_inputs = &mut compile.host_inputs;
    for option in options {
        let (key, value) = option
            .split_once('=')
            .ok_or_else(|| format!("--option {option:?}: expected KEY=VALUE"))?;
        let number = || -> Result<usize, String> {
            value
                .parse()
                .map_err(|_| format!("--option {key}: {value:?} is not a whole number"))
        };
        match key {
            "beam_width" => search.beam_width = number()?,
            "finalists" => search.finalists = number()?,
            "max_candidates" => search.max_candidates = number()?,
            "accumulation" => {
                *accumulation = match value {
                    "auto" => Accumulation::Auto,
                    "f16" => Accumulation::F16,
                    "f32" => Accumulation::F32,
                    _ => return Err(format!("--option accumulation={value}: expected auto, f16 or f32")),
                }
            }
            "stream_b" => {
                search.stream_b_resident = match value {
                    "auto" => None,
                    "homes" => Some(false),
                    "resident" => Some(true),
                    _ => return Err(format!("--option stream_b={value}: expected auto, homes or resident")),
                }
            }
            "attention_layout" => {
                use ipu_compiler::attention::AttentionLayout;
                *attention_layout = match value {
                    "auto" => None,
                    "rows" => Some(AttentionLayout::Rows),
                    "columns" => Some(AttentionLayout::Columns),
                    _ => return Err(format!("--option attention_layout={value}: expected auto, rows or columns")),
                }
            }
            "attention_merge" => {
                compile.attention_accumulate = match value {
                    "auto" => None,
                    "accumulate" => Some(true),
                    "merge" => Some(false),
                    _ => return Err(format!("--option attention_merge={value}: expected auto, accumulate or merge")),
                }
            }
            "host_inputs" => {
                *host_inputs = match value {
                    "once" => HostInputs::Once,
                    "replicated" => HostInputs::Replicated,
                    _ => return Err(format!("--option host_inputs={value}: expected once or replicated")),
                }
            }
            "repeat" => {
                compile.repeat = match value {
                    "loop" => RepeatLowering::Loop,
                    "expand" => RepeatLowering::Expand,
                    _ => return Err(format!("--option repeat={value}: expected loop or expand")),
                }
            }
            "loop_weights" => {
                use ipu_compiler::loops::LoopWeights;
                compile.loop_weights = match value {
                    "auto" => None,
                    "stack" => Some(LoopWeights::Stacked),
                    "stream" => Some(LoopWeights::Streamed),
                    _ => return Err(format!("--option loop_weights={value}: expected auto, stack or stream")),
                }
            }
            _ => {
                return Err(format!(
                    "unknown --option {key:?}: known options are beam_width, finalists, max_candidates, accumulation, attention_layout, attention_merge, stream_b, host_inputs, repeat, loop_weights"
                ))
            }
        }
    }
    Ok(())
}
