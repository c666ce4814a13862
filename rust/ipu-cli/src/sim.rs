//! `ipu sim IMAGE`: runs a linked tile image on the simulator, for quick
//! kernel experiments without a package. Packages run through `ipu run`.

use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct SimArgs {
    /// A tile image written by ipu-ld.
    image: PathBuf,
    /// Load the same image on this many tiles.
    #[arg(long, default_value_t = 1)]
    tiles: u32,
    /// Most bundles a tile may issue in one BSP step.
    #[arg(long, default_value_t = 200_000_000)]
    step_limit: u64,
}

pub fn run(args: SimArgs) -> Result<(), String> {
    let bytes = std::fs::read(&args.image).map_err(|e| format!("{}: {e}", args.image.display()))?;
    let image = ipu_object::TileImage::from_bytes(&bytes)
        .map_err(|e| format!("{}: {e}", args.image.display()))?;
    let mut chip = ipu_sim::Chip::try_new(ipu_sim::ChipConfig {
        tiles: args.tiles,
        step_limit: args.step_limit,
        ..Default::default()
    })
    .map_err(|e| format!("--tiles: {e}"))?;
    let symbols: Arc<ipu_sim::SymbolMap> = Arc::new(
        image
            .symbols
            .iter()
            .map(|(name, s)| (s.address, name.clone()))
            .collect(),
    );
    for tile in 0..args.tiles {
        for segment in &image.segments {
            chip.write(tile, segment.address, &segment.bytes)
                .map_err(|e| e.to_string())?;
        }
        chip.set_entry(tile, image.entry)
            .map_err(|e| e.to_string())?;
        chip.set_symbols(tile, symbols.clone())
            .map_err(|e| e.to_string())?;
    }
    // A raw image has no host: every host sync simply resumes.
    loop {
        match chip.run().map_err(|e| e.to_string())? {
            ipu_sim::Stop::Exited => break,
            ipu_sim::Stop::HostSync => continue,
        }
    }
    for (i, step) in chip.steps().iter().enumerate() {
        let busiest = step
            .tiles
            .iter()
            .map(|t| t.compute_cycles)
            .max()
            .unwrap_or(0);
        let bundles: u64 = step.tiles.iter().map(|t| t.bundles).sum();
        println!(
            "step {i}: {:?} cycles {}..{} compute(max tile) {busiest} bundles {bundles}",
            step.kind, step.start_cycle, step.end_cycle
        );
    }
    println!("total cycles {}", chip.cycles());
    Ok(())
}
