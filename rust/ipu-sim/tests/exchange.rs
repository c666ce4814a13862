//! Exchange timing against hand-computed schedules, multicast, descriptor
//! tables, the 4-byte-per-cycle port ceiling and every rule violation.

mod common;
use common::*;
use ipu_sim::{Chip, FaultKind, SimError};

fn send(addr: u32, words: u32, start: u32) -> String {
    format!(
        "setzi $m10, {addr}\nsetzi $m11, {words}\nsetzi $m12, {start}\nxsend $m10, $m11, $m12\n"
    )
}

fn recv(addr: u32, words: u32, src: u32, start: u32) -> String {
    format!(
        "setzi $m10, {addr}\nsetzi $m11, {words}\nsetzi $m13, {src}\nsetzi $m12, {start}\nxrecv $m10, $m11, $m13, $m12\n"
    )
}

/// Runs tiles whose programs are `sync`, then `exchange(tile)`, then `xend` and `exit`.
fn run_exchange(n: u32, exchange: impl Fn(u32) -> String) -> Result<Chip, SimError> {
    let data: Vec<u32> = (0..64).map(|i| 0xA000_0000 + i).collect();
    run_tiles(
        n,
        |t| format!("sync\n{}xend\nexit\n", exchange(t)),
        |t| {
            vec![(
                IN,
                words(&data.iter().map(|d| d + (t << 16)).collect::<Vec<_>>()),
            )]
        },
    )
}

fn tile_words(chip: &Chip, tile: u32, addr: u32, n: u32) -> Vec<u32> {
    chip.peek(tile, addr, 4 * n)
        .unwrap()
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn hand_computed_schedule_with_multicast_and_descriptor_table() {
    // Tile 0 sends words 0..8 in cycles 100..108. Tile 1 receives all eight;
    // tile 2 captures words 2..6 (cycles 102..106). Tile 1 sends four words in
    // cycles 110..114 to tile 0, described by an xtab descriptor.
    // Tile 1's descriptor {kind = send, address, words, start} is preloaded
    // (stores are not allowed in the exchange phase).
    let data: Vec<u32> = (0..64).map(|i| 0xA000_0000 + i).collect();
    let chip = run_tiles(
        3,
        |t| {
            let x = match t {
                0 => format!("{}{}", send(IN, 8, 100), recv(OUT, 4, 1, 110)),
                1 => format!(
                    "{}setzi $m14, 0x90100\nsetzi $m9, 1\nxtab $m14, $m9\n",
                    recv(OUT, 8, 0, 100)
                ),
                _ => recv(OUT, 4, 0, 102),
            };
            format!("sync\n{x}xend\nexit\n")
        },
        |t| {
            let mut v = vec![(
                IN,
                words(&data.iter().map(|d| d + (t << 16)).collect::<Vec<_>>()),
            )];
            if t == 1 {
                v.push((OUT + 0x100, words(&[u32::MAX, IN + 16, 4, 110])));
            }
            v
        },
    )
    .unwrap();
    assert_eq!(
        tile_words(&chip, 1, OUT, 8),
        (0..8).map(|i| 0xA000_0000 + i).collect::<Vec<_>>()
    );
    assert_eq!(
        tile_words(&chip, 2, OUT, 4),
        (2..6).map(|i| 0xA000_0000 + i).collect::<Vec<_>>()
    );
    assert_eq!(
        tile_words(&chip, 0, OUT, 4),
        (4..8).map(|i| 0xA001_0000 + i).collect::<Vec<_>>()
    );
    let step = &chip.steps()[0];
    // Exchange cycles = end of each tile's last transfer (all xends are earlier).
    let ex: Vec<u64> = step.tiles.iter().map(|t| t.exchange_cycles).collect();
    assert_eq!(ex, [114, 114, 106]);
    let sent: Vec<u64> = step.tiles.iter().map(|t| t.words_sent).collect();
    let received: Vec<u64> = step.tiles.iter().map(|t| t.words_received).collect();
    assert_eq!((sent, received), (vec![8, 4, 0], vec![4, 8, 4]));
    // Every tile synced at the same cycle: sync cycles include the 600-cycle sync.
    let t0 = step.tiles[0].compute_cycles + step.tiles[0].sync_cycles;
    for t in &step.tiles {
        assert_eq!(t.compute_cycles + t.sync_cycles, t0);
        assert!(t.sync_cycles >= ipu_arch::SYNC_CYCLES);
    }
}

#[test]
fn a_receive_may_span_consecutive_sends_of_one_source() {
    let chip = run_exchange(2, |t| match t {
        0 => format!("{}{}", send(IN, 3, 50), send(IN + 40, 2, 53)),
        _ => recv(OUT, 5, 0, 50),
    })
    .unwrap();
    let w = |i: u32| 0xA000_0000 + i;
    assert_eq!(
        tile_words(&chip, 1, OUT, 5),
        [w(0), w(1), w(2), w(10), w(11)]
    );
}

#[test]
fn ports_never_move_more_than_four_bytes_per_cycle() {
    // 4 tiles each send 32 words to tile 4, one after another: tile 4's
    // receive port needs 128 cycles; the exchange phase cannot be shorter.
    let chip = run_exchange(5, |t| {
        if t < 4 {
            send(IN, 32, 200 + 32 * t)
        } else {
            (0..4)
                .map(|s| recv(OUT + 128 * s, 32, s, 200 + 32 * s))
                .collect()
        }
    })
    .unwrap();
    let step = &chip.steps()[0];
    assert_eq!(step.tiles[4].exchange_cycles, 200 + 128);
    for t in &step.tiles {
        assert!(4 * t.words_received <= 4 * t.exchange_cycles);
        assert!(4 * t.words_sent <= 4 * t.exchange_cycles);
    }
    // Receiving two streams at once would beat the port: it is an error.
    let err = run_exchange(3, |t| match t {
        0 | 1 => send(IN, 8, 100),
        _ => format!("{}{}", recv(OUT, 8, 0, 100), recv(OUT + 64, 8, 1, 100)),
    })
    .unwrap_err();
    assert!(
        matches!(err.kind, FaultKind::RecvPortOverlap { .. }),
        "{err}"
    );
}

fn expect_fault(err: SimError, tile: u32, pred: impl Fn(&FaultKind) -> bool) {
    assert_eq!(err.tile, tile, "{err}");
    assert!(pred(&err.kind), "unexpected fault: {err}");
    assert!(
        err.instruction.is_some(),
        "fault names the instruction: {err}"
    );
}

#[test]
fn every_rule_violation_is_an_error() {
    // Two sends overlapping on tile 0's send port.
    let e = run_exchange(2, |t| match t {
        0 => format!("{}{}", send(IN, 8, 100), send(IN + 64, 4, 104)),
        _ => String::new(),
    })
    .unwrap_err();
    expect_fault(e, 0, |k| {
        matches!(
            k,
            FaultKind::SendPortOverlap {
                first_start: 100,
                second_start: 104
            }
        )
    });
    // A receive cycle in which the source sends nothing.
    let e = run_exchange(2, |t| match t {
        0 => send(IN, 4, 100),
        _ => recv(OUT, 6, 0, 100),
    })
    .unwrap_err();
    expect_fault(e, 1, |k| {
        *k == FaultKind::NoSourceWord {
            source: 0,
            cycle: 104,
        }
    });
    // A receive naming the wrong cycles of a send.
    let e = run_exchange(2, |t| match t {
        0 => send(IN, 4, 100),
        _ => recv(OUT, 4, 0, 99),
    })
    .unwrap_err();
    expect_fault(e, 1, |k| {
        *k == FaultKind::NoSourceWord {
            source: 0,
            cycle: 99,
        }
    });
    // An exchange instruction issued after its start cycle.
    let e = run_exchange(2, |t| match t {
        0 => send(IN, 4, 3),
        _ => String::new(),
    })
    .unwrap_err();
    expect_fault(e, 0, |k| {
        matches!(k, FaultKind::LateExchange { start: 3, .. })
    });
    // A source tile that does not exist.
    let e = run_exchange(2, |t| match t {
        0 => recv(OUT, 4, 9, 100),
        _ => String::new(),
    })
    .unwrap_err();
    expect_fault(e, 0, |k| *k == FaultKind::BadSourceTile { source: 9 });
    // Ranges outside SRAM and misaligned.
    let e = run_exchange(2, |t| match t {
        0 => send(0xE7FF8, 4, 100),
        _ => String::new(),
    })
    .unwrap_err();
    expect_fault(e, 0, |k| {
        matches!(
            k,
            FaultKind::BadTransferRange {
                address: 0xE7FF8,
                words: 4
            }
        )
    });
    let e = run_exchange(2, |t| match t {
        0 => send(IN, 4, 100),
        _ => recv(OUT + 2, 4, 0, 100),
    })
    .unwrap_err();
    expect_fault(e, 1, |k| matches!(k, FaultKind::BadTransferRange { .. }));
    // A receive overwriting this tile's own send source.
    let e = run_exchange(2, |t| match t {
        0 => format!("{}{}", send(IN, 8, 100), recv(IN + 16, 2, 1, 100)),
        _ => send(IN, 2, 100),
    })
    .unwrap_err();
    expect_fault(e, 0, |k| {
        matches!(k, FaultKind::ReceiveOverwritesSend { .. })
    });
}

#[test]
fn exchange_phase_discipline() {
    // Exchange instructions outside an exchange phase.
    let e = run_one(&format!("{}exit\n", send(IN, 1, 0)), &[]).unwrap_err();
    expect_fault(e, 0, |k| *k == FaultKind::NotInExchangePhase);
    // Stores (and worker launches) inside it.
    let e = run_one(
        "sync\nsetzi $m2, 0x90000\nst32 $m2, [$m2]\nxend\nexit\n",
        &[],
    )
    .unwrap_err();
    expect_fault(e, 0, |k| *k == FaultKind::NotAllowedInExchangePhase);
    // Tiles that disagree on how a phase ends.
    let e = run_tiles(
        2,
        |t| {
            if t == 0 {
                "exit\n".into()
            } else {
                "sync\nxend\nexit\n".into()
            }
        },
        |_| vec![],
    )
    .unwrap_err();
    assert!(matches!(e.kind, FaultKind::SyncMismatch { .. }), "{e}");
}

#[test]
fn an_empty_exchange_costs_exactly_the_sync() {
    let chip = run_tiles(2, |_| "sync\nxend\nexit\n".into(), |_| vec![]).unwrap();
    let s = &chip.steps()[0];
    assert_eq!(s.tiles[0].sync_cycles, ipu_arch::SYNC_CYCLES);
    // xend issues at T0 and compute resumes one supervisor slot later.
    assert_eq!(s.tiles[0].exchange_cycles, 6);
    assert_eq!(
        s.end_cycle,
        s.tiles[0].compute_cycles + ipu_arch::SYNC_CYCLES + 6
    );
}

#[test]
fn descriptor_tables_issue_one_descriptor_per_cycle() {
    // xtab with 12 descriptors occupies the supervisor for two slots (12
    // cycles); each descriptor counts as issued one cycle after the previous.
    let table: Vec<u32> = (0..12)
        .flat_map(|i| [u32::MAX, IN + 4 * i, 1, 40 + i])
        .collect();
    let chip = run_tiles(
        2,
        |t| {
            if t == 0 {
                "sync\nsetzi $m2, 0x90100\nsetzi $m3, 12\nget $m4, cycle_lo\nxtab $m2, $m3\nget $m5, cycle_lo\nxend\nsub $m5, $m5, $m4\nsetzi $m6, 0x90000\nst32 $m5, [$m6]\nexit\n".into()
            } else {
                format!("sync\n{}xend\nexit\n", recv(OUT, 12, 0, 40))
            }
        },
        |t| if t == 0 { vec![(OUT + 0x100, words(&table)), (IN, words(&(0..12).collect::<Vec<u32>>()))] } else { vec![] },
    )
    .unwrap();
    assert_eq!(tile_words(&chip, 0, OUT, 1), [6 + 12]);
    assert_eq!(tile_words(&chip, 1, OUT, 12), (0..12).collect::<Vec<u32>>());
    // A descriptor whose start precedes its issue cycle is late: descriptor 11
    // issues at xtab + 11 but would start at xtab + 10.
    let late: Vec<u32> = (0..12)
        .flat_map(|i| {
            [
                u32::MAX,
                IN + 4 * i,
                1,
                if i == 11 { 12 + 10 } else { 40 + i },
            ]
        })
        .collect();
    let err = run_tiles(
        1,
        |_| "sync\nsetzi $m2, 0x90100\nsetzi $m3, 12\nxtab $m2, $m3\nxend\nexit\n".into(),
        |_| vec![(OUT + 0x100, words(&late))],
    )
    .unwrap_err();
    assert!(
        matches!(
            err.kind,
            FaultKind::LateExchange {
                start: 22,
                issued: 23
            }
        ),
        "{err}"
    );
}

#[test]
fn a_stride_prefix_makes_the_next_descriptor_move_runs() {
    // Tile 0 sends words 0, 1 | 4, 5 | 8, 9 of its input (runs of 2 words,
    // 16 bytes apart) in cycles 40..46 with one strided send; tile 1 writes
    // them as runs of 3 words, 32 bytes apart, with one strided receive. The
    // prefix takes the first table entry, so the descriptor issues one cycle
    // after `xtab`: at 13 for a start of 13 (the standard prologue issues
    // `xtab` at 12).
    let table = |kind: u32, addr: u32, run: u32, bytes: u32, start: u32| {
        words(&[
            ipu_arch::XTAB_STRIDE_KIND,
            run,
            bytes,
            0,
            kind,
            addr,
            6,
            start,
        ])
    };
    let prologue = "sync\nsetzi $m2, 0x90100\nsetzi $m3, 2\nxtab $m2, $m3\nxend\nexit\n";
    let chip = run_tiles(
        2,
        |_| prologue.into(),
        |t| {
            let data: Vec<u32> = (0..16).map(|i| 0xA000_0000 + i).collect();
            if t == 0 {
                vec![
                    (IN, words(&data)),
                    (OUT + 0x100, table(u32::MAX, IN, 2, 16, 40)),
                ]
            } else {
                vec![
                    (OUT, words(&[0; 24])),
                    (OUT + 0x100, table(0, OUT, 3, 32, 40)),
                ]
            }
        },
    )
    .unwrap();
    let got = tile_words(&chip, 1, OUT, 24);
    let w = |i: u32| 0xA000_0000 + i;
    let mut want = vec![0; 24];
    want[0..3].copy_from_slice(&[w(0), w(1), w(4)]);
    want[8..11].copy_from_slice(&[w(5), w(8), w(9)]);
    assert_eq!(got, want);
    let step = &chip.steps()[0];
    assert_eq!(step.tiles[1].exchange_cycles, 46);
    assert_eq!(step.tiles[1].words_received, 6);
    // Starting at 12, the strided send would be late: its prefix issues at
    // 12 and the descriptor at 13.
    let err = run_tiles(
        1,
        |_| prologue.into(),
        |_| {
            vec![
                (IN, words(&[0; 16])),
                (OUT + 0x100, table(u32::MAX, IN, 2, 16, 12)),
            ]
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err.kind,
            FaultKind::LateExchange {
                start: 12,
                issued: 13
            }
        ),
        "{err}"
    );
    // Runs of zero words, and a prefix with no descriptor after it, fault.
    for (table, count) in [
        (table(u32::MAX, IN, 0, 16, 40), 2),
        (table(u32::MAX, IN, 2, 16, 40), 1),
    ] {
        let err = run_tiles(
            1,
            |_| {
                format!("sync\nsetzi $m2, 0x90100\nsetzi $m3, {count}\nxtab $m2, $m3\nxend\nexit\n")
            },
            |_| vec![(IN, words(&[0; 16])), (OUT + 0x100, table.clone())],
        )
        .unwrap_err();
        assert!(
            matches!(err.kind, FaultKind::BadStride { slot: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("stride prefix"), "{err}");
    }
}
