//! One-tile tests of the supervisor runtime (device/supervisor.S): its
//! command dispatch (calls by index, the exit command, unknown calls, the
//! checkpoint flag) and both step kinds (compute groups with and without
//! waiting, exchange steps whose `xtab` must issue at the scheduled offset),
//! executed by the simulator from the program tables that `emit` writes.
//! Device loops (`rt_loop`, `rt_next`) run their body the given number of
//! times and advance the weight-stack offset that copy64_list adds.
//! The workers are real kernels (fill32, copy64, copy64_list); the host only writes the
//! command word and memory at `hsync`s and reads results back.

use ipu_compiler::attention::launch_cycles;
use ipu_compiler::emit::{self, ProgramTable, Record};
use ipu_compiler::plan::supervisor_cycles;
use ipu_compiler::storage::COMMAND_ADDRESS;
use ipu_exchange::lower::{Descriptor, SEND_KIND, XTAB_ISSUE_OFFSET};
use ipu_sim::{Chip, ChipConfig, StepKind, Stop};
use std::path::PathBuf;
use std::sync::Arc;

fn device_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../../device")
}

fn assemble(file: &str) -> ipu_asm::Assembly {
    ipu_asm::assemble_file(&device_dir().join(file), &ipu_asm::Options::default())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Links the table with the runtime and the two kernels, loads it with
/// `memory` into a one-tile chip and runs it to its idle `hsync`.
fn load(table: &ProgramTable, memory: &[(u32, Vec<u8>)]) -> Chip {
    emit::verify(table).unwrap_or_else(|e| panic!("{e}"));
    let text = emit::table_text(table);
    let prog = ipu_asm::assemble_source(
        "table.S",
        &text,
        std::path::Path::new("."),
        &ipu_asm::Options::default(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mut inputs = vec![ipu_link::Input {
        name: "table.o".into(),
        object: prog.object,
    }];
    for file in [
        emit::RUNTIME_SOURCE,
        "fill32.S",
        "copy64.S",
        "copy64_list.S",
    ] {
        inputs.push(ipu_link::Input {
            name: file.into(),
            object: assemble(file).object,
        });
    }
    let linked = ipu_link::link(&inputs, &ipu_link::LinkOptions::new(emit::ENTRY))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut chip = Chip::new(ChipConfig {
        tiles: 1,
        ..ChipConfig::default()
    });
    for s in &linked.image.segments {
        chip.write(0, s.address, &s.bytes).unwrap();
    }
    for (addr, bytes) in memory {
        chip.write(0, *addr, bytes).unwrap();
    }
    let symbols: ipu_sim::SymbolMap = linked
        .image
        .symbols
        .iter()
        .map(|(n, s)| (s.address, n.clone()))
        .collect();
    chip.set_symbols(0, Arc::new(symbols)).unwrap();
    chip.set_entry(0, linked.image.entry).unwrap();
    assert_eq!(step(&mut chip), Stop::HostSync, "the idle hsync");
    chip
}

fn step(chip: &mut Chip) -> Stop {
    chip.run().unwrap_or_else(|e| panic!("{e}"))
}

/// Writes the command word and runs to the next `hsync` or the exit.
fn command(chip: &mut Chip, word: u32) -> Stop {
    chip.write(0, COMMAND_ADDRESS, &word.to_le_bytes()).unwrap();
    step(chip)
}

fn words(chip: &Chip, addr: u32, n: u32) -> Vec<u32> {
    chip.peek(0, addr, 4 * n)
        .unwrap()
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn run(wait: bool, entry: &str, states: &[&str]) -> Record {
    Record::Run {
        wait,
        entry: entry.into(),
        states: states.iter().map(|s| s.to_string()).collect(),
    }
}

fn fill(label: &str, dst: u32, n: u32, value: u32) -> (String, Vec<u32>) {
    (label.into(), vec![dst, n, value])
}

fn copy(label: &str, src: u32, dst: u32, bytes: u32) -> (String, Vec<u32>) {
    (label.into(), vec![src, dst, bytes])
}

const A: u32 = 0x9_0000;
const B: u32 = 0x9_1000;
const C: u32 = 0xA_0000;
const D: u32 = 0xA_1000;

#[test]
fn dispatch_runs_the_called_call_and_the_compute_sets_in_order() {
    // Call 0 fills A. Call 1: one compute set of three fills (B0..B2) and two
    // copies (A -> C0, C1), i.e. two groups of different entries; then a
    // second compute set that copies B0 to D and must see B0 filled.
    let table = ProgramTable {
        tile: 0,
        calls: vec![
            (
                "initialize".into(),
                vec![run(false, "fill32", &["fa"]), Record::End { wait: true }],
            ),
            (
                "run".into(),
                vec![
                    run(false, "fill32", &["fb0", "fb1", "fb2"]),
                    run(false, "copy64", &["c0", "c1"]),
                    run(true, "copy64", &["cd"]),
                    Record::End { wait: true },
                ],
            ),
        ],
        states: vec![
            fill("fa", A, 64, 0xA5A5_0001),
            fill("fb0", B, 32, 0xB0),
            fill("fb1", B + 0x100, 32, 0xB1),
            fill("fb2", B + 0x200, 32, 0xB2),
            copy("c0", A, C, 128),
            copy("c1", A + 128, C + 128, 128),
            copy("cd", B, D, 128),
        ],
    };
    let mut chip = load(&table, &[]);
    assert_eq!(command(&mut chip, 0), Stop::HostSync);
    assert_eq!(words(&chip, A, 64), vec![0xA5A5_0001; 64]);
    assert_eq!(words(&chip, B, 32), vec![0; 32], "call 1 has not run");
    assert_eq!(command(&mut chip, 1), Stop::HostSync);
    for (i, v) in [0xB0, 0xB1, 0xB2].into_iter().enumerate() {
        assert_eq!(words(&chip, B + 0x100 * i as u32, 32), vec![v; 32]);
    }
    assert_eq!(words(&chip, C, 64), vec![0xA5A5_0001; 64]);
    assert_eq!(
        words(&chip, D, 32),
        vec![0xB0; 32],
        "the second set ran after the first"
    );
    // Calls repeat: clear D and run call 1 again.
    chip.write(0, D, &[0; 128]).unwrap();
    assert_eq!(command(&mut chip, 1), Stop::HostSync);
    assert_eq!(words(&chip, D, 32), vec![0xB0; 32]);
    // An unknown call index ends the program like the exit command.
    assert_eq!(command(&mut chip, 2), Stop::Exited);
    let mut chip = load(&table, &[]);
    assert_eq!(command(&mut chip, u32::MAX), Stop::Exited);
    assert_eq!(words(&chip, A, 1), vec![0], "the exit command runs no call");
}

#[test]
fn six_vertices_of_one_entry_and_a_seventh_that_waits_for_a_worker() {
    let names: Vec<String> = (0..7).map(|i| format!("f{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let table = ProgramTable {
        tile: 0,
        calls: vec![(
            "run".into(),
            vec![
                run(false, "fill32", &refs[..6]),
                run(false, "fill32", &refs[6..]),
                Record::End { wait: true },
            ],
        )],
        states: (0..7)
            .map(|i| fill(&names[i], A + 0x100 * i as u32, 16, 100 + i as u32))
            .collect(),
    };
    let mut chip = load(&table, &[]);
    assert_eq!(command(&mut chip, 0), Stop::HostSync);
    for i in 0..7u32 {
        assert_eq!(
            words(&chip, A + 0x100 * i, 16),
            vec![100 + i; 16],
            "vertex {i}"
        );
    }
}

/// One tile sends `n` words to itself: the send starts at the issue offset
/// (descriptor 0, issued with `xtab`), the receive (descriptor 1, issued a
/// cycle later) takes words 1..n of it.
fn self_exchange(n: u32) -> Vec<u8> {
    let c = XTAB_ISSUE_OFFSET as u32;
    let send = Descriptor::plain(SEND_KIND, C, n, c);
    let recv = Descriptor::plain(0, D, n - 1, c + 1);
    ipu_exchange::lower::encode_table(&[send, recv])
}

const TABLE: u32 = 0xB_0000;

#[test]
fn exchange_steps_issue_xtab_at_the_scheduled_offset() {
    // Call 0: fill C (compute), exchange C -> D (waits for the fill), copy
    // D -> A (after the exchange: no wait). Call 1: an exchange as the first
    // record. The send starts exactly at the issue offset, so an `xtab` one
    // cycle later than the standard prologue's would fault as late.
    for n in [9u32, 64] {
        let table = ProgramTable {
            tile: 0,
            calls: vec![
                (
                    "run".into(),
                    vec![
                        run(false, "fill32", &["fc"]),
                        Record::Exchange {
                            wait: true,
                            table: TABLE,
                            count: 2,
                        },
                        run(false, "copy64", &["cp"]),
                        Record::End { wait: true },
                    ],
                ),
                (
                    "again".into(),
                    vec![
                        Record::Exchange {
                            wait: false,
                            table: TABLE,
                            count: 2,
                        },
                        Record::End { wait: false },
                    ],
                ),
            ],
            states: vec![
                fill("fc", C, n, 0xC0DE),
                copy("cp", D, A, 8 * ((n - 1) / 2)),
            ],
        };
        let mut chip = load(&table, &[(TABLE, self_exchange(n))]);
        assert_eq!(command(&mut chip, 0), Stop::HostSync);
        assert_eq!(
            words(&chip, D, n),
            [vec![0xC0DE; n as usize - 1], vec![0]].concat()
        );
        let copied = 2 * ((n - 1) / 2);
        assert_eq!(words(&chip, A, copied), vec![0xC0DE; copied as usize]);
        // The phase lasts until the later of `xend` + 6 (xend issues one
        // round after `xtab`, two descriptors being one round) and the end
        // of the receive: ipu-exchange's `exchange_cycles` for this table.
        let c = XTAB_ISSUE_OFFSET;
        let expect = (c + 6 + 6).max(c + 1 + (n as u64 - 1));
        let x: Vec<_> = chip
            .steps()
            .iter()
            .filter(|s| s.kind == StepKind::Sync)
            .collect();
        assert_eq!(x.len(), 1);
        assert_eq!(x[0].tiles[0].exchange_cycles, expect, "n = {n}");
        chip.write(0, D, &bytes(&vec![0; n as usize])).unwrap();
        assert_eq!(command(&mut chip, 1), Stop::HostSync);
        assert_eq!(words(&chip, D, 1), vec![0xC0DE]);
        let x: Vec<_> = chip
            .steps()
            .iter()
            .filter(|s| s.kind == StepKind::Sync)
            .collect();
        assert_eq!(x[1].tiles[0].exchange_cycles, expect, "n = {n}");
    }
}

#[test]
fn checkpoint_stops_happen_only_in_checkpoint_runs() {
    let table = ProgramTable {
        tile: 0,
        calls: vec![(
            "run".into(),
            vec![
                run(false, "fill32", &["fa"]),
                Record::Stop { wait: true },
                run(false, "copy64", &["cp"]),
                Record::End { wait: true },
            ],
        )],
        states: vec![fill("fa", A, 16, 7), copy("cp", A, C, 64)],
    };
    let mut chip = load(&table, &[]);
    // A normal run goes straight through the stop.
    assert_eq!(command(&mut chip, 0), Stop::HostSync);
    assert_eq!(words(&chip, C, 16), vec![7; 16]);
    // A checkpoint run stops after the fill, before the copy; the host only
    // reads there and resumes.
    chip.write(0, C, &[0; 64]).unwrap();
    assert_eq!(command(&mut chip, 0x8000_0000), Stop::HostSync);
    assert_eq!(words(&chip, A, 16), vec![7; 16]);
    assert_eq!(words(&chip, C, 16), vec![0; 16], "stopped before the copy");
    assert_eq!(step(&mut chip), Stop::HostSync);
    assert_eq!(words(&chip, C, 16), vec![7; 16]);
    assert_eq!(command(&mut chip, u32::MAX), Stop::Exited);
}

/// Device cycles of call 0 (from the host's resume to the final `hsync`) of
/// a table whose call is `steps` compute sets of `n` fill32 vertices that
/// each store `words` words, after an exchange step when `exchange_first`.
fn compute_set_cycles(steps: usize, n: usize, words: u32, exchange_first: bool) -> u64 {
    let mut records = Vec::new();
    let mut states = Vec::new();
    if exchange_first {
        records.push(Record::Exchange {
            wait: false,
            table: TABLE,
            count: 0,
        });
    }
    for s in 0..steps {
        let labels: Vec<String> = (0..n).map(|v| format!("f{s}_{v}")).collect();
        for (v, l) in labels.iter().enumerate() {
            states.push(fill(l, A + 0x1000 * v as u32, words, 1));
        }
        records.push(Record::Run {
            wait: s > 0,
            entry: "fill32".into(),
            states: labels,
        });
    }
    records.push(Record::End { wait: true });
    let table = ProgramTable {
        tile: 0,
        calls: vec![("run".into(), records)],
        states,
    };
    let mut chip = load(&table, &[]);
    let before = chip.steps().len();
    assert_eq!(command(&mut chip, 0), Stop::HostSync);
    chip.steps()[before..]
        .iter()
        .map(|s| s.tiles[0].compute_cycles + s.tiles[0].exchange_cycles)
        .sum()
}

/// The cost model's supervisor terms against the runtime's measured cost:
/// a compute set after another (`attention::launch_cycles`) and a call's
/// first compute set with the dispatch and the call's end
/// (`plan::supervisor_cycles`), both on top of the kernel's declared cycles
/// (fill32 of 64 words: `6 * (12 + N / 2)` = 264, which its single-vertex
/// step meets exactly). The model may be up to one supervisor bundle off.
#[test]
fn launch_costs_match_the_cost_model() {
    let kernel = 6 * (12 + 64 / 2);
    for n in 1..=6u64 {
        let third = compute_set_cycles(3, n as usize, 64, false)
            - compute_set_cycles(2, n as usize, 64, false);
        let model = kernel + launch_cycles(n);
        assert!(
            third.abs_diff(model) <= 6,
            "n = {n}: a compute set after another takes {third}, the model says {model}"
        );
        let first = compute_set_cycles(1, n as usize, 64, false);
        let model = kernel + supervisor_cycles(n);
        assert!(
            first.abs_diff(model) <= 6,
            "n = {n}: a call of one compute set takes {first}, the model says {model}"
        );
    }
    // After an exchange step nothing is preloaded: 18 cycles per further
    // vertex (the exchange step's own cost, `exchange::step_cycles`, already
    // has the bundle after `xend`).
    for n in 1..=6u64 {
        let after = compute_set_cycles(1, n as usize, 64, true)
            - compute_set_cycles(0, n as usize, 64, true);
        let model = kernel + 18 * (n - 1) + 6;
        assert!(
            after.abs_diff(model) <= 6,
            "n = {n}: {after} after an exchange, not {model}"
        );
    }
}

/// A device loop of `count` periods: each copies 64 bytes from slot k of a
/// stack (`copy64_list`, its source slot chosen by the index word) and
/// ends with an exchange step; the loop's records zero the index, advance
/// it by one per period and branch back while periods remain. Called twice:
/// the second call starts from slot 0 again.
#[test]
fn device_loops_run_their_body_count_times() {
    const STACK: u32 = 0x9_0000;
    const INDEX: u32 = 0x7_0000;
    for count in [1u32, 3] {
        let table = ProgramTable {
            tile: 0,
            calls: vec![(
                "run".into(),
                vec![
                    run(false, "fill32", &["fd"]),
                    Record::Loop {
                        count,
                        counter: "lc".into(),
                        index: format!("{INDEX:#x}"),
                    },
                    Record::Label("lb".into()),
                    run(true, "copy64_list", &["cl"]),
                    Record::Exchange {
                        wait: true,
                        table: TABLE,
                        count: 0,
                    },
                    Record::Next {
                        index: format!("{INDEX:#x}"),
                        delta: 1,
                        counter: "lc".into(),
                        body: "lb".into(),
                    },
                    Record::End { wait: false },
                ],
            )],
            states: vec![
                fill("fd", C, 16, 0xEE),
                ("cl".into(), vec![1, INDEX, STACK, 64, C, 64]),
            ],
        };
        let slots: Vec<u32> = (0..4u32).flat_map(|k| [k + 1; 16]).collect();
        let mut chip = load(&table, &[(STACK, bytes(&slots)), (INDEX, bytes(&[0xDEAD]))]);
        for call in 0..2 {
            let before = chip.steps().len();
            assert_eq!(command(&mut chip, 0), Stop::HostSync);
            let exchanges = chip.steps()[before..]
                .iter()
                .filter(|s| s.tiles[0].exchange_cycles > 0)
                .count();
            assert_eq!(
                exchanges, count as usize,
                "call {call}: one exchange per period"
            );
            assert_eq!(
                words(&chip, C, 16),
                vec![count; 16],
                "call {call}: the last period copied slot {}",
                count - 1
            );
            assert_eq!(words(&chip, INDEX, 1), vec![count], "call {call}");
        }
    }
}
