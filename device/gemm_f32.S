# f32 GEMM worker vertex on the AMP unit: C = A x B (or C = C0 + A x B) for
# one worker's share, f32 operands, f32 accumulation, f32 output (`ampf32`,
# 16 MAC/cycle/tile with six workers).
#
# The vertex computes C[m, c] = sum_k A[m, k] * B[k, c] for rows 0..M and the
# NCB column blocks of 16 columns starting at the state's B/C pointers, over
# NKB K blocks of 16. It has the vertex-state layout and memory contract of
# gemm_f16 (docs/kernels.md), with every row of a block twice as long: a K
# block of A is 64 bytes of a row, a column block of B or C is 64 bytes.
# Shapes and strides are read from the state at run time, so one object
# serves every shape. Edge shapes follow the layout contract: K and the
# column count are padded to 16 with zeros in A and B, so padded products
# add exact zeros.
#
# Vertex state (u32 words, byte offsets):
#    0 A      address of A[0, 0]; row-major f32, K padded to 16 (region 1,
#             8-aligned)
#    4 RS_A   A row stride in bytes (a multiple of 8, at least 64 * NKB;
#             RS_A - 56 fits in signed 16 bits)
#    8 B      address of B[0, c0]; row-major f32 [NKB*16, ...] (region 1,
#             16-aligned)
#   12 RS_B   B row stride in bytes (a multiple of 16, at least 64 * NCB)
#   16 CA     C buffer written by K block 0 (and 2, 4, ...), at row 0, column c0
#   20 CB     C buffer written by K block 1 (and 3, 5, ...); the result of the
#             last K block is in CA when NKB is odd, else in CB
#   24 RS_C   C row stride in bytes (both C buffers; a multiple of 8, at
#             least 64 * NCB; RS_C - 56 fits in signed 16 bits)
#   28 Z      address of 8 zero bytes in region 1 (the partials of K block 0),
#             or 0 for ACCUMULATE mode: K block 0 then reads its partials
#             from CB (rows 0..M+1 of the column block, RS_C apart), so the
#             vertex computes CA = CB + A x B over its first K block and
#             then alternates as usual
#   32 M      rows (>= 1)
#   36 NKB    K blocks (>= 1)
#   40 NCB    column blocks (>= 1)
#
# Memory contract (that of gemm_f16, checked by the compiler's storage
# validator):
# - A, CA and CB lie in pairwise disjoint interleaved memory elements (32 KiB):
#   the `ld2x64st64` of the inner loop loads A and one C buffer and stores the
#   other in the same instruction. Z (when not 0) lies in neither the element
#   set of CA nor that of A.
# - The vertex reads rows M and M+1 of A and of the partials buffer (the
#   pipeline runs one row ahead; their values feed only the drain), and it
#   writes rows -2 and -1 of its own column blocks in CA and CB (the outputs
#   of the pipeline before row 0). Those rows must exist and belong to no
#   other concurrently running worker.
#
# Pipeline: `ampf32` takes one f32 of x and one f32 partial per phase and
# emits one f32 of the previous row, 16 phases per row. Memory moves pairs:
# every odd bundle `{ ld2x64st64 ; ampf32 }` loads the next x pair and
# partials pair and stores an output pair, every even bundle is a lone
# `ampf32`. The amps of output pair i write $a4:5 (i even) or $a6:7 (i odd),
# so the store of pair i-1 (at pair i's odd bundle) never sees a half-written
# pair: the output stream lags the amps by one pair, and a row's results
# leave the AMP during the next row, so the stream has one extra (drain) row.
# Per row: 16 bundles = 256 MAC per 16 issue slots of one worker.

        .kernel gemm_f32
        .workers 6
# Issue slots (x 6 tile cycles): 22 entry and exit; per column block 15 of
# set-up (ACCUMULATE mode; 2 fewer with the zero word); per K block 16 per
# row plus 87: 65 for the weights (64 `ld128` paired with 64 `ampw`, the
# last beside the step of x to the block's A), the drain row's 16,
# preload, `rpt`, final store, the partials and output pointers and the
# loop branch.
        .cycles "6 * (22 + NCB * (15 + NKB * (16 * M + 87)))"

        .include "gemm_common.inc"

# Bytes of one K block of an A row, of one column block of a B or C row, and
# the row jump after the last 8-byte pair of such a block.
        .equ KBLOCK, 64
        .equ CBLOCK, 64
        .equ JUMP, 56

# Pace codes (gemm_common.inc): the low half of the stride pair is
# RS_A - 56 (next A row), the high half RS_C - 56 (next C row).

# One bundle of the weight load: load 16-byte chunk T of the 16x16 f32 block
# (four chunks per B row; the fourth steps to the next row with $m1 =
# RS_B - 48) and write chunk T-1, loaded by the previous bundle, into the
# weight store. Chunks alternate between $a8:11 (even) and $a12:15 (odd).
        .macro WBUNDLE t
        .if ((\t) & 1) && (((\t) & 3) == 3)
        { ld128 $a12:15, [$m8]+=$m1 ; ampw $a8:11, (\t) - 1 }
        .elseif (\t) & 1
        { ld128 $a12:15, [$m8]+=16 ; ampw $a8:11, (\t) - 1 }
        .else
        { ld128 $a8:11, [$m8]+=16 ; ampw $a12:15, (\t) - 1 }
        .endif
        .endm

# Loads the 16x16 f32 weight block at $m8 (rows RS_B apart) into the AMP
# weight store, 64 chunks in 65 bundles. Leaves $m8 at the next K block's rows; with STEP=1 the last bundle also
# steps x to this K block's A ($m4 += $m9, gemm_common.inc).
        .macro LOAD_WEIGHTS step
        ld128 $a8:11, [$m8]+=16
        .set WT, 1
        .rept 63
        WBUNDLE WT
        .set WT, WT + 1
        .endr
        .if \step
        { add $m4, $m4, $m9 ; ampw $a12:15, 63 }
        .else
        ampw $a12:15, 63
        .endif
        .endm

# One bundle at row position Q (0..15). PN/PJ: pace of the partials stream
# in ordinary positions / at the row jump (HOLD for the zero word).
        .macro BUNDLE q, pn, pj
        .set PAIR, (\q) / 2
        .if ((\q) & 1) == 0
        .if (PAIR & 1) == 0
        ampf32 $a4, $a0, $a2
        .else
        ampf32 $a6, $a0, $a2
        .endif
        .else
        # The load after x pair 7 of a row jumps A and the partials to the
        # next row; the store of pair 7 (at pair 0's bundle) jumps C.
        .if PAIR == 6
        .set PACE, LO | ((\pj) << 2) | (INC << 4)
        .elseif PAIR == 0
        .set PACE, INC | ((\pn) << 2) | (HI << 4)
        .else
        .set PACE, INC | ((\pn) << 2) | (INC << 4)
        .endif
        .if (PAIR & 1) == 0
        { ld2x64st64 $a0:3, $a6:7, $m4, $m7, PACE ; ampf32 $a5, $a1, $a3 }
        .else
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, PACE ; ampf32 $a7, $a1, $a3 }
        .endif
        .endif
        .endm

# One (column block, K block) product over all M rows. $m4 = A at this K
# block, $m5 = partials (or the zero word), $m6 = first (junk) output slot,
# $m14 = M + 1. The preload brings x pair 0 and partials pair 0 of row 0
# (its store writes the junk slot, which the first real store overwrites);
# the final store writes pair 7 of row M-1.
        .macro STREAM pn, pj
        ld2x64st64 $a0:3, $a6:7, $m4, $m7, INC | ((\pn) << 2) | (HOLD << 4)
        rpt $m14, 16
        .set BQ, 0
        .rept 16
        BUNDLE BQ, \pn, \pj
        .set BQ, BQ + 1
        .endr
        st64 $a6:7, [$m6]
        .endm

# Register use: GEMM_DRIVER's (gemm_common.inc), with $m1 = RS_B - 48 (the
# weight load's step to the next B row after its three 16-byte chunks) and
# $m10 the column-block byte offset in B and C alike.
        .text
        .globl gemm_f32
        .entry gemm_f32
gemm_f32:
        GEMM_DRIVER -48, 0
