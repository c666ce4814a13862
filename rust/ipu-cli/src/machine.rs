//! `ipu machine`: the machine model the simulator and cost model obey.

use ipu_arch::*;

#[derive(clap::Args)]
pub struct MachineArgs {
    /// Print as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: MachineArgs) -> Result<(), String> {
    let rows: Vec<(&str, String)> = vec![
        ("tiles per chip", TILES_PER_CHIP.to_string()),
        ("SRAM per tile (bytes)", TILE_SRAM_BYTES.to_string()),
        (
            "region 0 (standard)",
            format!("0x{REGION0_BASE:X}..0x{REGION0_END:X}"),
        ),
        (
            "region 1 (interleaved)",
            format!("0x{REGION1_BASE:X}..0x{REGION1_END:X}"),
        ),
        ("worker contexts", WORKER_CONTEXTS.to_string()),
        ("AMP f16 MAC per tile cycle", AMP_MACS_F16_F16.to_string()),
        (
            "chip f16 FLOP per cycle",
            CHIP_F16_FLOP_PER_CYCLE.to_string(),
        ),
        (
            "exchange B/cycle per tile (send, receive)",
            format!("{EXCHANGE_SEND_BYTES_PER_CYCLE}, {EXCHANGE_RECV_BYTES_PER_CYCLE}"),
        ),
        ("BSP sync cycles", SYNC_CYCLES.to_string()),
        ("vertex launch cycles", VERTEX_LAUNCH_CYCLES.to_string()),
        (
            "host link bytes per second",
            HOST_LINK_BYTES_PER_SECOND.to_string(),
        ),
    ];
    if args.json {
        let map: serde_json::Map<String, serde_json::Value> = rows
            .into_iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v)))
            .collect();
        let text = serde_json::to_string_pretty(&map).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        for (k, v) in rows {
            println!("{k:<44} {v}");
        }
    }
    Ok(())
}
