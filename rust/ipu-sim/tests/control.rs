//! Control flow, hardware loops, the issue model, worker launch, host syncs
//! and determinism across thread counts.

mod common;
use common::*;
use ipu_sim::{Chip, ChipConfig, StepKind, Stop};

fn word_at(chip: &Chip, addr: u32) -> u32 {
    u32::from_le_bytes(chip.peek(0, addr, 4).unwrap().try_into().unwrap())
}

#[test]
fn branches_calls_and_loops_compute_what_they_should() {
    // Sum 1..=10 with brnzdec, a called subroutine doubling it, and an rpt
    // loop adding 3 five times; results stored to OUT.
    let program = "
        setzi $m2, 10
        setzi $m3, 0
    top:
        add $m3, $m3, $m2
        add $m2, $m2, -1
        brnz $m2, top
        call double
        rpt 5, 1
        add $m3, $m3, 3
        setzi $m4, 0x90000
        st32 $m3, [$m4]
        setzi $m5, 0
        brz $m5, skip
        st32 $m5, [$m4]
    skip:
        setzi $m6, 4
        setzi $m7, 0
    again:
        add $m7, $m7, 1
        brnzdec $m6, again
        st32 $m7, [$m4+4]
        setzi $m8, 0
        rpt $m8, 1
        add $m7, $m7, 100
        st32 $m7, [$m4+8]
        exit
    double:
        add $m3, $m3, $m3
        br $lr
    ";
    let chip = run_one(program, &[]).unwrap();
    assert_eq!(word_at(&chip, OUT), 2 * 55 + 15);
    assert_eq!(
        word_at(&chip, OUT + 4),
        5,
        "brnzdec runs the body count + 1 times"
    );
    assert_eq!(
        word_at(&chip, OUT + 8),
        5,
        "rpt with count 0 skips its body"
    );
}

#[test]
fn hardware_loops_have_zero_overhead() {
    // 100 iterations of a 2-bundle body cost exactly 200 issues of the worker.
    let body =
        |n: u32| format!("setzi $m2, {n}\nrpt $m2, 2\nadd $m3, $m3, 1\nadd $m4, $m4, 2\nexit\n");
    let a = run_one(&workers_program(&body(100), 1), &[]).unwrap();
    let b = run_one(&workers_program(&body(1), 1), &[]).unwrap();
    assert_eq!(
        compute_cycles(&a, 0, 0) - compute_cycles(&b, 0, 0),
        99 * 2 * 6
    );
}

#[test]
fn one_busy_worker_runs_at_one_sixth_and_six_at_full_rate() {
    let worker = "rpt 600, 1\nadd $m3, $m3, 1\nexit\n";
    let one = run_one(&workers_program(worker, 1), &[]).unwrap();
    let six = run_one(&workers_program(worker, 6), &[]).unwrap();
    let (c1, c6) = (compute_cycles(&one, 0, 0), compute_cycles(&six, 0, 0));
    // One worker: 602 bundles at one per 6 cycles. Six: the same wall time
    // plus the later launches (2 supervisor slots each), but six times the work.
    assert!((600 * 6..600 * 6 + 60).contains(&c1), "{c1}");
    assert!(c6 < c1 + 6 * 12 + 12, "{c6} vs {c1}");
    let b1 = one.steps()[0].tiles[0].bundles;
    let b6 = six.steps()[0].tiles[0].bundles;
    assert_eq!(b6 - b1, 5 * 602 + 5, "five more workers, five more runs");
    // Never more than one bundle per tile cycle.
    assert!(b6 <= c6, "{b6} bundles in {c6} cycles");
}

#[test]
fn the_supervisor_waits_while_six_workers_run_and_launch_costs_two_slots() {
    // The supervisor's own loop of 50 adds runs at one per 6 cycles when no
    // worker runs; with six long workers it cannot issue until one exits.
    let sup_only = run_one("rpt 50, 1\nadd $m3, $m3, 1\nexit\n", &[]).unwrap();
    assert_eq!(
        compute_cycles(&sup_only, 0, 0),
        51 * 6 + 1,
        "50 adds + rpt at 6 cycles, then exit"
    );
    let launches = |n: usize| {
        let mut s = String::from("setzi $m2, worker\n");
        for _ in 0..n {
            s.push_str("run $m2, $m3\n");
        }
        s.push_str("wsync\nexit\nworker:\nexit\n");
        compute_cycles(&run_one(&s, &[]).unwrap(), 0, 0)
    };
    assert_eq!(
        launches(4) - launches(3),
        12,
        "a vertex launch costs 2 supervisor slots (>= 11 cycles)"
    );
}

#[test]
fn get_reads_ids_and_the_cycle_counter() {
    let program = "
        get $m2, tile_id
        get $m3, context_id
        get $m4, cycle_lo
        get $m5, cycle_lo
        setzi $m6, 0x90000
        st32 $m2, [$m6]
        st32 $m3, [$m6+4]
        sub $m5, $m5, $m4
        st32 $m5, [$m6+8]
        exit
    ";
    let chip = run_tiles(3, |_| program.to_string(), |_| vec![]).unwrap();
    for t in 0..3 {
        let w = |a: u32| u32::from_le_bytes(chip.peek(t, a, 4).unwrap().try_into().unwrap());
        assert_eq!((w(OUT), w(OUT + 4), w(OUT + 8)), (t, 6, 6));
    }
}

#[test]
fn host_sync_charges_the_host_link_and_lets_the_host_exchange_data() {
    let program = "
        setzi $m2, 0x90000
        setzi $m3, 41
        st32 $m3, [$m2]
        hsync
        ld32 $m4, [$m2+4]
        add $m4, $m4, 1
        st32 $m4, [$m2+8]
        exit
    ";
    let mut chip = Chip::new(ChipConfig {
        tiles: 2,
        ..ChipConfig::default()
    });
    for t in 0..2 {
        chip.write(t, CODE, &assemble(program)).unwrap();
        chip.set_entry(t, CODE).unwrap();
    }
    assert_eq!(chip.run().unwrap(), Stop::HostSync);
    let before = chip.cycles();
    for t in 0..2 {
        let v = chip.read(t, OUT, 4).unwrap();
        assert_eq!(v, 41u32.to_le_bytes());
        chip.write(t, OUT + 4, &(100 + t).to_le_bytes()).unwrap();
    }
    // 16 bytes over the host link.
    assert_eq!(chip.host_bytes_pending(), 16);
    assert_eq!(chip.run().unwrap(), Stop::Exited);
    for t in 0..2 {
        assert_eq!(chip.peek(t, OUT + 8, 4).unwrap(), (101 + t).to_le_bytes());
    }
    let steps = chip.steps();
    assert_eq!(steps[0].kind, StepKind::HostSync);
    let host = ipu_arch::host_transfer_cycles(16, ipu_arch::CLOCK_HZ_C600);
    assert_eq!(steps[0].end_cycle, before + host);
    assert!(steps[0].tiles[0].sync_cycles >= ipu_arch::SYNC_CYCLES + host);
    assert_eq!(steps[1].start_cycle, before + host);
}

#[test]
fn results_and_counters_do_not_depend_on_the_thread_count() {
    // Eight tiles of different lengths exchange a ring of words twice.
    let program = |t: u32| {
        format!(
            "
            setzi $m2, {t}
            rpt $m2, 1
            add $m3, $m3, 7
            setzi $m4, 0x90000
            st32 $m3, [$m4]
            sync
            setzi $m5, 1
            setzi $m6, 60
            setzi $m7, 0x90000
            xsend $m7, $m5, $m6
            setzi $m8, 0x90010
            setzi $m9, {src}
            xrecv $m8, $m5, $m9, $m6
            xend
            exit
            ",
            src = (t + 7) % 8
        )
    };
    let run_with = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| run_tiles(8, program, |_| vec![]).unwrap())
    };
    let a = run_with(1);
    let b = run_with(2);
    let c = run_with(5);
    assert_eq!(a.steps(), b.steps());
    assert_eq!(a.steps(), c.steps());
    for t in 0..8 {
        let got = a.peek(t, OUT + 0x10, 4).unwrap();
        assert_eq!(got, b.peek(t, OUT + 0x10, 4).unwrap());
        assert_eq!(
            u32::from_le_bytes(got.try_into().unwrap()),
            7 * ((t + 7) % 8)
        );
    }
}
