//! Every fault kind, with the location it names.

mod common;
use common::*;
use ipu_sim::{Chip, ChipConfig, FaultKind, SimError};
use std::sync::Arc;

fn worker_fault(worker: &str) -> SimError {
    run_one(&workers_program(worker, 1), &[]).unwrap_err()
}

#[test]
fn memory_faults() {
    let e = worker_fault("setzi $m2, 0x90002\nld32 $a0, [$m2]\nexit\n");
    assert_eq!(
        e.kind,
        FaultKind::Misaligned {
            address: 0x90002,
            bytes: 4
        }
    );
    assert_eq!(e.context, Some(0));
    assert_eq!(e.instruction.as_deref(), Some("ld32 $a0, [$m2]"));
    let e = worker_fault("setzi $m2, 0xE8000\nst32 $m2, [$m2]\nexit\n");
    assert_eq!(
        e.kind,
        FaultKind::OutOfRange {
            address: 0xE8000,
            bytes: 4
        }
    );
    let e = worker_fault("setzi $m2, 0x4B000\nld64 $a0:1, [$m2]\nexit\n");
    assert_eq!(
        e.kind,
        FaultKind::OutOfRange {
            address: 0x4B000,
            bytes: 8
        }
    );
    let e = worker_fault("setzi $m2, 0x70000\nld128 $a0:3, [$m2]\nexit\n");
    assert_eq!(e.kind, FaultKind::NotInterleaved { address: 0x70000 });
    // Load and store of one instruction in the same element (standard memory, 16 KiB).
    let e = worker_fault(
        "setzi $m4, 0x70000\nsetzi $m5, 0x70100\nld64st64 $a0:1, $a2:3, $m4, $m6, 0\nexit\n",
    );
    assert_eq!(
        e.kind,
        FaultKind::MemoryConflict {
            first: 0x70000,
            second: 0x70100
        }
    );
    // Two loads of ld2x64st64 in one bank of one interleaved element.
    let e = worker_fault(
        "setzi $m4, 0x80000\nsetzi $m5, 0x80010\nsetzi $m6, 0x70000\nld2x64st64 $a0:3, $a4:5, $m4, $m7, 0\nexit\n",
    );
    assert_eq!(
        e.kind,
        FaultKind::MemoryConflict {
            first: 0x80000,
            second: 0x80010
        }
    );
    // ... but the other bank (address bit 3) is fine.
    run_one(
        &workers_program(
            "setzi $m4, 0x80000\nsetzi $m5, 0x80018\nsetzi $m6, 0x70000\nld2x64st64 $a0:3, $a4:5, $m4, $m7, 0\nexit\n",
            1,
        ),
        &[],
    )
    .unwrap();
}

#[test]
fn fetch_and_decode_faults() {
    // Jumping into interleaved memory.
    let e = run_one("setzi $m2, 0x80000\nbr $m2\n", &[]).unwrap_err();
    assert_eq!(e.kind, FaultKind::BadFetch { pc: 0x80000 });
    assert_eq!(e.context, Some(6));
    // Running into zeroed memory.
    let e = run_one("nop\n", &[]).unwrap_err();
    assert!(
        matches!(e.kind, FaultKind::IllegalInstruction { word: 0, .. }),
        "{e}"
    );
    assert_eq!(e.pc, Some(CODE + 4));
    // A word with an unknown opcode placed as data.
    let mut chip = Chip::new(ChipConfig {
        tiles: 1,
        ..ChipConfig::default()
    });
    chip.write(0, CODE, &0x7F00_0000u32.to_le_bytes()).unwrap();
    chip.set_entry(0, CODE).unwrap();
    let e = chip.run().unwrap_err();
    assert!(
        matches!(
            e.kind,
            FaultKind::IllegalInstruction {
                word: 0x7F00_0000,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn context_class_faults() {
    let e = run_one("f32add $a0, $a1, $a2\nexit\n", &[]).unwrap_err();
    assert_eq!(e.kind, FaultKind::FloatInSupervisor);
    let e = worker_fault("sync\nexit\n");
    assert_eq!(e.kind, FaultKind::SupervisorOnlyInWorker);
    let e = worker_fault("rpt 3, 2\nadd $m2, $m2, 1\nbr $m2\nexit\n");
    assert_eq!(e.kind, FaultKind::ControlInLoopBody);
    let e = worker_fault("ampclr\nampf16 $a4:5, $a0:1, $a2:3\nampf32 $a4, $a0, $a2\nexit\n");
    assert_eq!(
        e.kind,
        FaultKind::AmpModeMismatch {
            current: "ampf16".into(),
            requested: "ampf32".into()
        }
    );
    // ampclr resets the mode.
    run_one(
        &workers_program(
            "ampf16 $a4:5, $a0:1, $a2:3\nampclr\nampf32 $a4, $a0, $a2\nexit\n",
            1,
        ),
        &[],
    )
    .unwrap();
}

#[test]
fn workers_still_running_at_sync_or_exit() {
    let looping =
        "setzi $m2, worker\nrun $m2, $m3\nsync\nxend\nexit\nworker:\nrpt 100, 1\nnop\nexit\n";
    let e = run_one(looping, &[]).unwrap_err();
    assert_eq!(e.kind, FaultKind::WorkersStillRunning { running: vec![0] });
    let e = run_one(
        "setzi $m2, worker\nrun $m2, $m3\nexit\nworker:\nrpt 100, 1\nnop\nexit\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(e.kind, FaultKind::WorkersStillRunning { running: vec![0] });
}

#[test]
fn a_worker_that_never_finishes_hits_the_step_limit_and_names_its_symbol() {
    let program = workers_program("spin:\nbr spin\n", 1);
    let mut b = ipu_isa::build::ProgramBuilder::new(CODE);
    b.asm_block(&program).unwrap();
    let image = b.finish().unwrap();
    let mut chip = Chip::new(ChipConfig {
        tiles: 2,
        step_limit: 10_000,
        ..ChipConfig::default()
    });
    let symbols: ipu_sim::SymbolMap = [
        (CODE, "supervisor".to_string()),
        (b.address_of("worker").unwrap(), "spin_vertex".to_string()),
    ]
    .into();
    let symbols = Arc::new(symbols);
    for t in 0..2 {
        chip.write(t, CODE, &image).unwrap();
        chip.set_entry(t, CODE).unwrap();
        chip.set_symbols(t, symbols.clone()).unwrap();
    }
    let e = chip.run().unwrap_err();
    assert_eq!(e.kind, FaultKind::StepLimit { limit: 10_000 });
    assert_eq!(
        (e.tile, e.context),
        (0, Some(0)),
        "the lowest failing tile is reported: {e}"
    );
    assert_eq!(e.symbol.as_deref(), Some("spin_vertex"));
    assert_eq!(
        e.to_string(),
        "tile 0, worker 0, pc 0x4c014 <spin_vertex> `br +0`, BSP step 0: more than 10000 bundles in one BSP phase (a context never finishes?)"
    );
}
