//! Settling the supervisor's launch costs once the call's steps are in
//! order (`settle_launches`, run by the driver after lowering).
//!
//! The runtime's supervisor spends a different time around a compute step
//! depending on what the tile ran before it in the call
//! (device/supervisor.S; tests/supervisor_runtime.rs measures each case):
//!
//! - the call's first step: the command's dispatch and the call's end, then
//!   18 cycles a vertex (`plan::supervisor_cycles(n)` = 78 + 18 n);
//! - after an exchange or a host stop: 18 cycles a vertex (18 n - 12);
//! - after another compute step: 12 cycles a vertex (12 n - 6,
//!   `attention::launch_cycles`), since the step's record loads in the
//!   shadow of the previous step's workers.
//!
//! The GEMM planners cost a plan's steps before the steps are in order, so
//! each step's estimate assumes a place ([`Launch`]): a whole-K GEMM's
//! step the call's first (it may be), its reduce after that step, a
//! streamed GEMM's chunk steps and reduce-scatter after their exchanges.
//! Where a step is elsewhere, [`settle_launches`] corrects its estimate.
//! Before it did, the GEMM steps of a chain of small GEMMs, which follow
//! each other on the same tiles, were each charged the call's first step's
//! cost, 84 + 6 n cycles too much, and the estimates of such models came
//! out up to 16% above the simulator.

use crate::lower::{Launch, Lowered};

/// Supervisor cycles of a call's dispatch and end, which only the call's
/// first compute step pays: `plan::supervisor_cycles(n)` less
/// [`after_sync_cycles`]`(n)`.
pub const CALL_DISPATCH_CYCLES: u64 = 90;

/// Supervisor cycles around a compute step of `n` vertices that follows an
/// exchange or a host stop on its tiles: nothing is preloaded, so each
/// vertex's state load and `run` take 18 cycles (the exchange step's own
/// cost already has the bundle after `xend`).
pub fn after_sync_cycles(n: u64) -> u64 {
    18 * n.saturating_sub(1) + 6
}

impl Launch {
    /// The supervisor cycles around a compute step of `n` vertices at this
    /// place (none for [`Launch::Own`], whose estimate places its own).
    pub fn cycles(self, n: u64) -> u64 {
        match self {
            Launch::Own => 0,
            Launch::FirstOfCall => crate::plan::supervisor_cycles(n),
            Launch::AfterSync => after_sync_cycles(n),
            Launch::AfterCompute => crate::attention::launch_cycles(n),
        }
    }
}

/// Charges each compute step whose estimate assumed a place in its call
/// (every [`Launch`] but `Own`) the supervisor cost of the place it has.
/// A step runs on several tiles, each with its own history; it is charged
/// for the costliest (a tile whose last step synced pays more than one that
/// just computed), with `n` the most vertices any of its tiles runs (the
/// planners charged their slowest tile's count, which may differ from it by
/// a few vertices: the difference between two places' costs changes by 6
/// cycles a vertex at most). A settled step's launch becomes
/// [`Launch::Own`], except the call's first step, which becomes
/// [`Launch::FirstOfCall`]: its estimate then holds the call's dispatch.
/// The driver settles once, after the last `lower::verify`: a device
/// loop's rerun step may then differ from the step it reruns in its
/// estimate (the first iteration's first step follows other steps than
/// the later ones' do), never in what it runs.
pub fn settle_launches(l: &mut Lowered) {
    for call in &mut l.calls {
        // By tile, the place its next step would have (a deep loop syncs
        // thousands of times: a slice to fill). A tile that ran nothing
        // yet in a call whose first step is elsewhere still pays 18 cycles
        // a vertex, as after a sync.
        let mut next = vec![Launch::AfterSync; l.tile_count as usize];
        for (index, step) in call.steps.iter_mut().enumerate() {
            if step.ends_bsp_step() {
                next.fill(Launch::AfterSync);
                continue;
            }
            if step.launch != Launch::Own {
                let n = step
                    .tiles
                    .values()
                    .map(|v| v.len() as u64)
                    .max()
                    .unwrap_or(0)
                    .max(1);
                let place = if index == 0 {
                    Launch::FirstOfCall
                } else {
                    step.tiles
                        .keys()
                        .map(|&t| next.get(t as usize).copied().unwrap_or(Launch::AfterSync))
                        .max_by_key(|place| place.cycles(n))
                        .unwrap_or(Launch::AfterSync)
                };
                step.shift_estimate(place.cycles(n) as i64 - step.launch.cycles(n) as i64);
                step.launch = if place == Launch::FirstOfCall {
                    Launch::FirstOfCall
                } else {
                    Launch::Own
                };
            }
            for &t in step.tiles.keys() {
                if let Some(b) = next.get_mut(t as usize) {
                    *b = Launch::AfterCompute;
                }
            }
        }
    }
}

/// The supervisor cycles of `call`'s dispatch and end that no step's
/// estimate holds: all of [`CALL_DISPATCH_CYCLES`] unless the call's first
/// step is a compute step still charged as the first
/// ([`Launch::FirstOfCall`]).
pub fn unsettled_dispatch_cycles(call: &crate::lower::CallProgram) -> u64 {
    match call.steps.first() {
        Some(s) if s.launch == Launch::FirstOfCall => 0,
        _ => CALL_DISPATCH_CYCLES,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::{CallProgram, Step, Vertex};
    use std::sync::Arc;

    fn vertices(n: usize) -> Vec<Vertex> {
        (0..n)
            .map(|_| Vertex {
                kernel: Arc::new(crate::library::KernelRequest {
                    entry: "fill64".into(),
                    source: "fill64.S".into(),
                    params: Default::default(),
                }),
                state: Vec::new(),
            })
            .collect()
    }

    fn compute(tiles: &[(u32, usize)], estimate: u64, launch: Launch) -> Step {
        Step {
            tile_cycles: Default::default(),
            operation: "v".into(),
            phase: "compute".into(),
            tiles: Arc::new(tiles.iter().map(|&(t, n)| (t, vertices(n))).collect()),
            estimated_cycles: estimate,
            exchange: None,
            host_stop: false,
            launch,
        }
    }

    fn host_stop() -> Step {
        Step {
            tile_cycles: Default::default(),
            operation: "stop".into(),
            phase: "host stop".into(),
            tiles: Default::default(),
            estimated_cycles: 600,
            exchange: None,
            host_stop: true,
            launch: Launch::Own,
        }
    }

    /// The run call of two tiles made of `steps`, settled.
    fn settled(steps: Vec<Step>) -> CallProgram {
        let mut l = Lowered {
            tile_count: 2,
            ..Default::default()
        };
        l.calls.push(CallProgram {
            name: "run".into(),
            steps,
            ..Default::default()
        });
        settle_launches(&mut l);
        l.calls.remove(0)
    }

    /// The settled costs are the three the runtime measures
    /// (tests/supervisor_runtime.rs), on top of a kernel of 1,000 cycles.
    #[test]
    fn each_step_pays_the_cost_of_its_place() {
        let first = |n| 1_000 + crate::plan::supervisor_cycles(n);
        let mut call = settled(vec![
            compute(&[(0, 6), (1, 6)], first(6), Launch::FirstOfCall),
            compute(&[(0, 2), (1, 2)], first(2), Launch::FirstOfCall),
            host_stop(),
            compute(&[(0, 3), (1, 3)], first(3), Launch::FirstOfCall),
            // Tile 1 computed last, tile 0 synced: tile 0's cost.
            compute(&[(1, 1)], first(1), Launch::FirstOfCall),
            compute(&[(0, 1), (1, 1)], first(1), Launch::FirstOfCall),
            host_stop(),
            compute(&[(0, 4)], 1_234, Launch::Own),
        ]);
        let got: Vec<u64> = call.steps.iter().map(|s| s.estimated_cycles).collect();
        let launch = crate::attention::launch_cycles;
        assert_eq!(
            got,
            vec![
                first(6),
                1_000 + launch(2),
                600,
                1_000 + after_sync_cycles(3),
                1_000 + launch(1),
                1_000 + launch(1),
                600,
                1_234,
            ]
        );
        assert_eq!(call.steps[0].launch, Launch::FirstOfCall);
        assert!(call.steps[1..].iter().all(|s| s.launch == Launch::Own));
        assert_eq!(unsettled_dispatch_cycles(&call), 0);
        // A call that starts with a stop pays the dispatch outside any step.
        call.steps.remove(0);
        assert_eq!(unsettled_dispatch_cycles(&call), CALL_DISPATCH_CYCLES);
    }

    /// A tile after a sync and another after a compute step: the step is
    /// charged for the one that waits longer.
    #[test]
    fn a_step_is_charged_for_its_costliest_tile() {
        let first = |n| 500 + crate::plan::supervisor_cycles(n);
        let call = settled(vec![
            host_stop(),
            compute(&[(0, 2)], first(2), Launch::FirstOfCall),
            compute(&[(0, 5), (1, 5)], first(5), Launch::FirstOfCall),
        ]);
        assert_eq!(call.steps[1].estimated_cycles, 500 + after_sync_cycles(2));
        assert_eq!(call.steps[2].estimated_cycles, 500 + after_sync_cycles(5));
    }

    /// Estimates that assumed a step after a sync or after a compute step
    /// move to the cost of the place the step has, in either direction,
    /// and a first step takes the call's dispatch with it.
    #[test]
    fn every_assumed_place_settles_to_the_place_the_step_has() {
        let (sync, compute_after) = (after_sync_cycles, crate::attention::launch_cycles);
        let mut call = settled(vec![
            compute(&[(0, 3), (1, 3)], 700 + sync(3), Launch::AfterSync),
            compute(&[(0, 4), (1, 4)], 700 + sync(4), Launch::AfterSync),
            host_stop(),
            compute(
                &[(0, 2), (1, 2)],
                700 + compute_after(2),
                Launch::AfterCompute,
            ),
            compute(
                &[(0, 5), (1, 5)],
                700 + compute_after(5),
                Launch::AfterCompute,
            ),
        ]);
        let got: Vec<u64> = call.steps.iter().map(|s| s.estimated_cycles).collect();
        assert_eq!(
            got,
            vec![
                700 + crate::plan::supervisor_cycles(3),
                700 + compute_after(4),
                600,
                700 + sync(2),
                700 + compute_after(5),
            ]
        );
        assert_eq!(call.steps[0].launch, Launch::FirstOfCall);
        assert_eq!(unsettled_dispatch_cycles(&call), 0);
        // Settling twice changes nothing.
        let again = settled(std::mem::take(&mut call.steps));
        let twice: Vec<u64> = again.steps.iter().map(|s| s.estimated_cycles).collect();
        assert_eq!(twice, got);
    }

    /// A step costed tile by tile keeps each tile's own figure (never
    /// above the step's), and settling moves every tile's figure with the
    /// step's.
    #[test]
    fn tiles_costed_one_by_one_settle_together() {
        let mut step = compute(&[], 0, Launch::AfterSync);
        step.put_tile(0, vertices(3), 900 + after_sync_cycles(3));
        step.put_tile(1, vertices(3), 400 + after_sync_cycles(3));
        assert_eq!(step.estimated_cycles, 900 + after_sync_cycles(3));
        assert_eq!(step.tile_estimate(1), 400 + after_sync_cycles(3));
        let call = settled(vec![compute(&[(0, 1), (1, 1)], 50, Launch::Own), step]);
        let after = &call.steps[1];
        let compute_after = crate::attention::launch_cycles(3);
        assert_eq!(after.estimated_cycles, 900 + compute_after);
        assert_eq!(after.tile_estimate(0), 900 + compute_after);
        assert_eq!(after.tile_estimate(1), 400 + compute_after);
        // A tile the producer did not cost takes the step's figure.
        assert_eq!(after.tile_estimate(7), after.estimated_cycles);
    }

    #[test]
    fn the_dispatch_is_what_the_first_step_pays_beyond_a_later_one() {
        for n in 1..=6 {
            assert_eq!(
                Launch::FirstOfCall.cycles(n),
                CALL_DISPATCH_CYCLES + Launch::AfterSync.cycles(n)
            );
        }
    }
}
