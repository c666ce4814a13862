#!/usr/bin/env python3
"""Best grid programs for one f16 GEMM on the chip, by the kernels' formulas.

    tools/bounds/gemm_grids.py [M K N] [--tiles T] [--top N] [--any-memory] [--resident-b]

For every grid (row parts x column parts x K parts, at most T tiles) whose
two f16 C buffers and one K block of A and of B fit region 1 (any grid
with --any-memory), this prints
what a streamed program of that grid costs at least on this machine
(docs/machine-model.md), the slowest tile's part of each BSP step summed:

- compute: `gemm_f16` ACC=16 over the tile's whole K part in one call,
  the six vertices split into row and column groups as the compiler does
  (docs/kernels.md, "Cycles": 6 * (22 + NCB * (14 + NKB * (4 * M + 43))));
- exchange: the tile's A rows and B columns of its K part received at
  4 bytes a cycle (homes and multicast only help the senders); with
  --resident-b, B's part stays on the tile (a weight the initialize call
  writes, as the SigLIP projections keep theirs) and takes its region-1
  bytes instead;
- reduce-scatter: the other K parts' partial sums received, and their sum
  at `reduce_f32` ACC=16 PAIRS=1's (P - 1) bundles per four outputs;
- syncs: 600 cycles for the chunk exchange, the reduce-scatter and the
  host sync (more chunk steps only add syncs and calls).

It leaves out every chunk step's extra sync and launch, so a real program
of a grid runs longer than its line here. The figure for the 4096^3 GEMM
is the ceiling of what K-split grid programs of `gemm_f16` can reach
(session 38: 11 x 22 x 6 at 70.6% of peak, with or without the memory
limit, where the compiled program runs 69.5%); `ipu-bench gemm4096`
prints the BSP bound of any program beside it.
"""
import argparse
import math

REGION1 = 0xE8000 - 0x80000
TILE_FLOP_PER_CYCLE = 128
WORKERS = 6
SYNC = 600


def gemm_cycles(rows, col_blocks, k_blocks):
    """Slowest vertex of the best split of a shard over six vertices."""
    best = None
    for row_groups in (1, 2, 3, 6):
        col_groups = WORKERS // row_groups
        r = math.ceil(rows / row_groups)
        c = math.ceil(col_blocks / col_groups)
        cycles = 6 * (22 + c * (14 + k_blocks * (4 * r + 43)))
        best = cycles if best is None else min(best, cycles)
    return best


def grids(m_total, k_total, n_total, tiles, any_memory, resident_b):
    k_blocks_total = math.ceil(k_total / 16)
    for mp in range(1, min(m_total, tiles) + 1):
        for np_ in range(1, tiles // mp + 1):
            for kp in range(1, tiles // (mp * np_) + 1):
                m = math.ceil(m_total / mp)
                ncb = math.ceil(n_total / np_ / 16)
                n = ncb * 16
                kb = math.ceil(k_blocks_total / kp)
                region1 = 2 * (2 * m * n) + 32 * m + 32 * n
                if resident_b:
                    region1 += kb * 16 * n * 2
                if not any_memory and region1 > REGION1:
                    continue
                compute = gemm_cycles(m, ncb, kb)
                exchange = (m + (0 if resident_b else n)) * kb * 16 * 2 / 4
                partials = m * n * (kp - 1) / kp * 2 / 4
                reduce = m * n / kp * (kp - 1) / 4
                syncs = SYNC * (3 if kp > 1 else 2)
                total = compute + exchange + partials + reduce + syncs
                yield total, compute, exchange, partials, reduce, (mp, np_, kp)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", nargs="*", type=int, default=[4096, 4096, 4096], help="M K N (default 4096 4096 4096)")
    p.add_argument("--tiles", type=int, default=1472)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--any-memory", action="store_true", help="leave out the region-1 limit")
    p.add_argument("--resident-b", action="store_true", help="B's part stays on its tiles (no B exchange)")
    a = p.parse_args()
    if len(a.shape) != 3 or min(a.shape) < 1:
        p.error(f"the shape is M K N, three positive integers, not {a.shape}")
    m, k, n = a.shape
    if a.tiles < 1:
        p.error(f"--tiles must be positive, not {a.tiles}")
    peak = 2 * m * k * n / (TILE_FLOP_PER_CYCLE * a.tiles)
    ranked = sorted(grids(m, k, n, a.tiles, a.any_memory, a.resident_b))
    print(f"{m} x {k} x {n} f16 GEMM on {a.tiles} tiles: peak-rate bound {peak:.0f} cycles (f16 AMP peak on those tiles)")
    for total, compute, exchange, partials, reduce, g in ranked[: a.top]:
        print(
            f"  {g[0]:>3} x {g[1]:>3} x {g[2]:>2}: {total:>9.0f} cycles = {100 * peak / total:.1f}% of peak"
            f" (compute {compute:.0f}, operands {exchange:.0f}, partials {partials:.0f}, reduce {reduce:.0f})"
        )


if __name__ == "__main__":
    main()
