//! Phase `emit_code`: each tile's *program table*, the data that the
//! device-side supervisor runtime (`device/supervisor.S`) interprets.
//!
//! The runtime is one kernel-library object linked into every tile (its
//! entry [`ENTRY`] is the tile's entry point); it runs the command loop of
//! docs/host-protocol.md and executes the records of the called call's
//! table. This phase therefore emits data only: a header (command word
//! address, call count, one record list per call), the records and the
//! vertex states, as assembly text for `ipu-asm`. The table format is
//! documented in docs/runtime.md ("The supervisor runtime").
//!
//! Invariants, checked by [`verify`] before the text is produced:
//! - a record that follows a compute group without waiting is a compute
//!   group of the same compute set (exchange, stop and end records after a
//!   compute group use the `_w` handlers, which `wsync` first);
//! - a compute group starts 1 to 6 vertices of one entry;
//! - every call ends with an end record.
//!
//! Symbol names depend only on the call, step and vertex indices, so the same
//! lowered program gives byte-identical text.

use crate::library::KernelRequest;
use crate::lower::{Lowered, StateWord};
use crate::storage::{TileStorage, COMMAND_ADDRESS};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The tile program's entry symbol: the runtime's command loop.
pub const ENTRY: &str = "rt_main";

/// The symbol of the program table, which the runtime imports.
pub const PROGRAM_SYMBOL: &str = "rt_program";

/// The device source of the runtime.
pub const RUNTIME_SOURCE: &str = "supervisor.S";

/// The kernel-library request for the runtime object (no specialisation
/// parameters, so its global names are not mangled).
pub fn runtime_request() -> KernelRequest {
    KernelRequest {
        entry: ENTRY.to_string(),
        source: RUNTIME_SOURCE.to_string(),
        params: BTreeMap::new(),
    }
}

/// One record of a call's table. `wait` selects the handler variant that
/// first waits for the workers started by earlier records (`wsync`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Start the vertices of one entry (`run` each): the entry symbol and
    /// the labels of their state blocks.
    Run {
        wait: bool,
        entry: String,
        states: Vec<String>,
    },
    /// `sync`, `xtab` of `count` descriptors at `table`, `xend`.
    Exchange { wait: bool, table: u32, count: u32 },
    /// A checkpoint stop (an `hsync` only in checkpoint runs). The compiler
    /// emits none yet (`checkpoints.json` lists no stops); the runtime and
    /// this format support them so that adding stops needs no device change.
    Stop { wait: bool },
    /// A host stop: an `hsync` on every run, at which the host writes the
    /// inputs of the stop (a device loop's streamed weights).
    Host { wait: bool },
    /// The call's end: back to the idle `hsync`.
    End { wait: bool },
    /// A device loop starts: `count` into the record's own counter word
    /// (labelled `counter`), zero into the loop's index word at `index` (an
    /// address or a label). Workers that still run are not waited for.
    Loop {
        count: u32,
        counter: String,
        index: String,
    },
    /// The end of a device loop's body: `delta` added to the word at
    /// `index`, the `counter` word decremented, and while it is not zero
    /// the next record is the one labelled `body`. No worker may run.
    Next {
        index: String,
        delta: u32,
        counter: String,
        body: String,
    },
    /// A label for the next record (no words): a loop body's first.
    Label(String),
}

impl Record {
    /// The runtime handler that executes the record.
    pub fn handler(&self) -> String {
        let (name, wait) = match self {
            Record::Run { wait, states, .. } => (format!("rt_run{}", states.len()), *wait),
            Record::Exchange { wait, .. } => ("rt_exchange".to_string(), *wait),
            Record::Stop { wait } => ("rt_stop".to_string(), *wait),
            Record::Host { wait } => ("rt_host".to_string(), *wait),
            Record::End { wait } => ("rt_end".to_string(), *wait),
            Record::Loop { .. } => ("rt_loop".to_string(), false),
            Record::Next { .. } => ("rt_next".to_string(), false),
            Record::Label(_) => (String::new(), false),
        };
        if wait {
            format!("{name}_w")
        } else {
            name
        }
    }

    /// The record's words after the handler word, as assembly operands.
    fn operands(&self) -> Vec<String> {
        match self {
            Record::Run { entry, states, .. } => std::iter::once(entry.clone())
                .chain(states.iter().cloned())
                .collect(),
            Record::Exchange { table, count, .. } => vec![format!("{table:#x}"), count.to_string()],
            Record::Stop { .. } | Record::Host { .. } | Record::End { .. } | Record::Label(_) => {
                Vec::new()
            }
            Record::Loop { count, index, .. } => {
                vec![count.to_string(), "0".into(), index.clone()]
            }
            Record::Next {
                index,
                delta,
                counter,
                body,
            } => vec![
                index.clone(),
                delta.to_string(),
                counter.clone(),
                body.clone(),
            ],
        }
    }
}

/// A tile's program table: records per call and the vertex states they name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramTable {
    pub tile: u32,
    /// Per call (index = command word): its records, the last an end record.
    pub calls: Vec<(String, Vec<Record>)>,
    /// Vertex state blocks: (label, words).
    pub states: Vec<(String, Vec<u32>)>,
}

/// The program table of `tile`; buffer addresses come from `storage`.
pub fn program_table(l: &Lowered, tile: u32, storage: &TileStorage) -> ProgramTable {
    let mut states = Vec::new();
    let mut calls = Vec::new();
    for (ci, call) in l.calls.iter().enumerate() {
        let mut records = Vec::new();
        // Whether workers started by an earlier record may still run.
        let mut running = false;
        // The `rt_next` records of open loops, by the step they precede.
        let mut loop_ends: Vec<(usize, Record)> = Vec::new();
        // Steps in a device loop's later periods are not emitted: the
        // loop's records run the first period again.
        let mut skip_to = 0;
        for (si, step) in call.steps.iter().enumerate() {
            if si < skip_to {
                continue;
            }
            // A loop that ends here closes before one that starts here
            // (the streamed iterations' loop right after the stacked ones').
            if let Some(i) = loop_ends.iter().position(|(at, _)| *at == si) {
                let (_, next) = loop_ends.remove(i);
                records.push(next);
                let lp = call
                    .loops
                    .iter()
                    .find(|l| l.start + l.period == si)
                    .expect("a loop ends here");
                skip_to = lp.start + lp.period * lp.count as usize;
                if si < skip_to {
                    continue;
                }
            }
            if let Some((k, lp)) = call.loops.iter().enumerate().find(|(_, l)| l.start == si) {
                let counter = format!("loop_count_{ci}_{k}");
                let index = match lp.index.get(&tile) {
                    Some(&buffer) => format!("{:#x}", storage.addresses[buffer]),
                    None => {
                        let label = format!("loop_index_{ci}_{k}");
                        states.push((label.clone(), vec![0]));
                        label
                    }
                };
                records.push(Record::Loop {
                    count: lp.count,
                    counter: counter.clone(),
                    index: index.clone(),
                });
                let body = format!("loop_body_{ci}_{k}");
                records.push(Record::Label(body.clone()));
                loop_ends.push((
                    lp.start + lp.period,
                    Record::Next {
                        index,
                        delta: 1,
                        counter,
                        body,
                    },
                ));
            }
            // A rerun names the vertex states of the step it runs again
            // (its exchange table is that step's buffer already).
            let state_step = call.reruns.get(&si).copied().unwrap_or(si);
            if let Some(x) = &step.exchange {
                // Every tile takes part in the sync, with or without
                // descriptors; the table is a buffer whose contents `link`
                // writes into the image.
                let count =
                    x.tables
                        .get(tile as usize)
                        .map_or(0, |t| ipu_exchange::lower::slots(t)) as u32;
                records.push(Record::Exchange {
                    wait: running,
                    table: storage.addresses[x.table_buffers[&tile]],
                    count,
                });
                running = false;
                continue;
            }
            if step.host_stop {
                records.push(Record::Host { wait: running });
                running = false;
                continue;
            }
            let Some(vertices) = step.tiles.get(&tile).filter(|v| !v.is_empty()) else {
                continue;
            };
            // Consecutive vertices of one entry share a record (at most six,
            // one per worker); only the step's first record waits for the
            // previous compute set.
            let mut first = true;
            let mut vi = 0;
            while vi < vertices.len() {
                let entry = vertices[vi].kernel.symbol();
                let mut labels = Vec::new();
                while vi < vertices.len()
                    && labels.len() < ipu_arch::WORKER_CONTEXTS as usize
                    && vertices[vi].kernel.symbol() == entry
                {
                    let label = format!("vs_{ci}_{state_step}_{vi}");
                    if state_step == si {
                        let words = vertices[vi]
                            .state
                            .iter()
                            .map(|w| match *w {
                                StateWord::Const(c) => c,
                                StateWord::Addr { buffer, offset } => {
                                    storage.addresses[buffer] + offset
                                }
                            })
                            .collect();
                        states.push((label.clone(), words));
                    }
                    labels.push(label);
                    vi += 1;
                }
                records.push(Record::Run {
                    wait: first && running,
                    entry,
                    states: labels,
                });
                first = false;
            }
            running = true;
        }
        if let Some(i) = loop_ends.iter().position(|(at, _)| *at == call.steps.len()) {
            records.push(loop_ends.remove(i).1);
            running = false;
        }
        records.push(Record::End { wait: running });
        calls.push((call.name.clone(), records));
    }
    ProgramTable {
        tile,
        calls,
        states,
    }
}

/// Checks the invariants of the module documentation.
pub fn verify(t: &ProgramTable) -> Result<(), String> {
    for (ci, (name, records)) in t.calls.iter().enumerate() {
        let at = |ri: usize| format!("tile {}: call {ci} (`{name}`), record {ri}", t.tile);
        let mut running = false;
        for (ri, r) in records.iter().enumerate() {
            match r {
                Record::Run { states, .. } => {
                    if states.is_empty() || states.len() > ipu_arch::WORKER_CONTEXTS as usize {
                        return Err(format!(
                            "{}: a compute group of {} vertices (1 to {} allowed)",
                            at(ri),
                            states.len(),
                            ipu_arch::WORKER_CONTEXTS
                        ));
                    }
                    running = true;
                }
                Record::Label(_) | Record::Loop { .. } => {}
                Record::Next { .. } => {
                    if running {
                        return Err(format!(
                            "{}: `rt_next` follows a compute group, whose workers may still run",
                            at(ri)
                        ));
                    }
                }
                Record::Exchange { wait, .. }
                | Record::Stop { wait }
                | Record::Host { wait }
                | Record::End { wait } => {
                    if running && !wait {
                        return Err(format!(
                            "{}: `{}` follows a compute group without waiting for its workers",
                            at(ri),
                            r.handler()
                        ));
                    }
                    running = false;
                }
            }
            if matches!(r, Record::End { .. }) != (ri + 1 == records.len()) {
                return Err(format!(
                    "{}: the end record must be the call's last record",
                    at(ri)
                ));
            }
        }
        if records.is_empty() {
            return Err(format!("{}: no end record", at(0)));
        }
    }
    Ok(())
}

/// The program table as assembly text (data only; the code is the runtime's).
pub fn table_text(t: &ProgramTable) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Program table of tile {} (generated by ipu-compiler; see docs/runtime.md).",
        t.tile
    );
    let _ = writeln!(
        s,
        "        .data\n        .align 4\n        .globl {PROGRAM_SYMBOL}\n{PROGRAM_SYMBOL}:"
    );
    let _ = writeln!(s, "        .word {COMMAND_ADDRESS:#x}, {}", t.calls.len());
    for ci in 0..t.calls.len() {
        let _ = writeln!(s, "        .word call_{ci}");
    }
    for (ci, (name, records)) in t.calls.iter().enumerate() {
        let _ = writeln!(s, "# call {ci}: {name}\ncall_{ci}:");
        for r in records {
            match r {
                Record::Label(label) => {
                    let _ = writeln!(s, "{label}:");
                }
                // The loop's counter word is the record's second operand.
                Record::Loop {
                    count,
                    counter,
                    index,
                } => {
                    let _ = writeln!(s, "        .word {}, {count}", r.handler());
                    let _ = writeln!(s, "{counter}: .word 0");
                    let _ = writeln!(s, "        .word {index}");
                }
                _ => {
                    let words: Vec<String> =
                        std::iter::once(r.handler()).chain(r.operands()).collect();
                    let _ = writeln!(s, "        .word {}", words.join(", "));
                }
            }
        }
    }
    for (label, words) in &t.states {
        let words: Vec<String> = words.iter().map(|w| format!("{w:#x}")).collect();
        let _ = writeln!(s, "{label}: .word {}", words.join(", "));
    }
    s
}

/// The assembly text of `tile`'s program table; buffer addresses come from
/// `storage`. A table that breaks the runtime's invariants is a compiler bug,
/// reported as a verifier error.
pub fn tile_program(l: &Lowered, tile: u32, storage: &TileStorage) -> Result<String, String> {
    let table = program_table(l, tile, storage);
    verify(&table)?;
    Ok(table_text(&table))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(wait: bool, n: usize) -> Record {
        Record::Run {
            wait,
            entry: "k".into(),
            states: (0..n).map(|i| format!("s{i}")).collect(),
        }
    }

    fn table(records: Vec<Record>) -> ProgramTable {
        ProgramTable {
            tile: 3,
            calls: vec![("run".into(), records)],
            states: Vec::new(),
        }
    }

    #[test]
    fn handlers_name_the_group_size_and_the_wait() {
        assert_eq!(run(true, 6).handler(), "rt_run6_w");
        assert_eq!(run(false, 1).handler(), "rt_run1");
        assert_eq!(Record::End { wait: true }.handler(), "rt_end_w");
        let x = Record::Exchange {
            wait: false,
            table: 0x5000,
            count: 7,
        };
        assert_eq!(x.handler(), "rt_exchange");
        assert_eq!(x.operands(), vec!["0x5000".to_string(), "7".to_string()]);
    }

    #[test]
    fn verifier_accepts_a_well_formed_call() {
        let t = table(vec![
            run(false, 6),
            run(false, 2),
            run(true, 3),
            Record::Exchange {
                wait: true,
                table: 0x5000,
                count: 1,
            },
            Record::Stop { wait: false },
            Record::End { wait: false },
        ]);
        assert_eq!(verify(&t), Ok(()));
    }

    #[test]
    fn verifier_rejects_a_sync_while_workers_run() {
        let t = table(vec![
            run(false, 2),
            Record::Exchange {
                wait: false,
                table: 0x5000,
                count: 1,
            },
            Record::End { wait: false },
        ]);
        let e = verify(&t).unwrap_err();
        assert!(
            e.contains("tile 3: call 0 (`run`), record 1: `rt_exchange` follows a compute group"),
            "{e}"
        );
        let t = table(vec![run(false, 2), Record::End { wait: false }]);
        assert!(verify(&t).unwrap_err().contains("record 1: `rt_end`"));
    }

    #[test]
    fn verifier_rejects_bad_groups_and_a_missing_end() {
        let e = verify(&table(vec![run(false, 7), Record::End { wait: true }])).unwrap_err();
        assert!(e.contains("record 0: a compute group of 7 vertices"), "{e}");
        let e = verify(&table(vec![run(false, 1)])).unwrap_err();
        assert!(
            e.contains("the end record must be the call's last record"),
            "{e}"
        );
        let e = verify(&table(vec![])).unwrap_err();
        assert!(e.contains("no end record"), "{e}");
    }
}
