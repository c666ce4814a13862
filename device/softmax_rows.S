# Row-wise softmax of an [ROWS, COLS] f16 matrix: y[r, c] = exp(t[r, c] -
# m[r]) / sum_c exp(t[r, c] - m[r]) with t = f32(x * SCALE) and m[r] the
# row maximum of t, written as f16 (round to nearest even). The maximum,
# the exponentials and the sum are f32; only the output is f16.
#
# Any ROWS >= 1 and COLS >= 1: a row is COLS >> 2 groups of four (vector
# path, `ld64`/`st64`) and then COLS & 3 single elements (scalar path,
# `ld16`/`st16`), so COLS need not be a multiple of 4.
#
# Vertex state (u32 words, byte offsets):
#    0 IN      address of x[0, 0] (f16, 8-aligned, any region)
#    4 RS_IN   input row stride in bytes (multiple of 8)
#    8 OUT     address of y[0, 0] (f16, 8-aligned; may equal IN: each group
#              of four is read before it is written)
#   12 RS_OUT  output row stride in bytes (multiple of 8)
#   16 ROWS    rows (>= 1)
#   20 COLS    columns (>= 1)
#   24 SCALE   f32 bits of the scale applied before the maximum (> 0, e.g.
#              1.0 for a plain softmax or 1/sqrt(d) in attention)
#
# SCALE must be positive: the pass that finds the maximum runs on the raw
# f16 values (`f16v4hmax`) and scales the maximum once, which equals the
# maximum of the scaled values only for a positive (monotone) scale.
#
# Each worker runs its own vertex (its own state block, a contiguous range
# of rows); workers never share a row, so no worker reads another's output.
#
# Three passes per row: (1) maximum of the raw row, (2) sum of exp(t - m)
# in f32 (two interleaved lanes, added by `f32v2hsum`, then the scalar
# tail), (3) exp(t - m) recomputed and multiplied by f32 recip(sum), then
# converted to f16. Recomputing the exponentials in pass 3 costs two issue
# slots per pair but needs no scratch buffer of ROWS x COLS f32 values.

        .kernel softmax_rows
        .workers 6
        # Per row: 22 bundles, 34 per group of four, 20 per tail element, written
        # without `%` for the compiler's formula evaluator: 34 * (COLS / 4) +
        # 20 * (COLS % 4) = 20 * COLS - 46 * (COLS / 4).
        .cycles "6 * (6 + ROWS * (22 + 20 * COLS - 46 * (COLS / 4)))"

        .equ ST_IN, 0
        .equ ST_RS_IN, 4
        .equ ST_OUT, 8
        .equ ST_RS_OUT, 12
        .equ ST_ROWS, 16
        .equ ST_COLS, 20
        .equ ST_SCALE, 24

# Registers: $m2 input row, $m3 output row, $m4 rows left - 1, $m5 groups of
# four per row, $m6 tail elements, $m7 input walk, $m8 output walk, $m9
# RS_IN, $m10 RS_OUT. $a12:13 SCALE pair, $a14:15 row maximum pair, $a10:11
# sum pair and later the reciprocal pair, $a3 running maximum.

        .macro EXP4
        # $a0:1 holds four f16 inputs; leaves exp(t - m) in $a2:3 and $a4:5.
        f16v2tof32 $a2:3, $a0
        f16v2tof32 $a4:5, $a1
        f32v2mul $a2:3, $a2:3, $a12:13
        f32v2mul $a4:5, $a4:5, $a12:13
        f32v2sub $a2:3, $a2:3, $a14:15
        f32v2sub $a4:5, $a4:5, $a14:15
        f32v2exp $a2:3, $a2:3
        f32v2exp $a4:5, $a4:5
        .endm

        .macro EXP1
        # $a0 holds one f16 input (high half zero); leaves exp(t - m) in $a0.
        f16v2tof32 $a0:1, $a0
        f32mul $a0, $a0, $a12
        f32sub $a0, $a0, $a14
        f32exp $a0, $a0
        .endm

        .text
        .globl softmax_rows
        .entry softmax_rows
softmax_rows:
        ld32 $m2, [$m0 + ST_IN]
        ld32 $m9, [$m0 + ST_RS_IN]
        ld32 $m3, [$m0 + ST_OUT]
        ld32 $m10, [$m0 + ST_RS_OUT]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m6, [$m0 + ST_COLS]
        shr $m5, $m6, 2
        and $m6, $m6, 3
        ld32 $a12, [$m0 + ST_SCALE]
        f32v2bcast $a12:13, $a12
row:
        # Pass 1: maximum of the raw row. Each group's `f16v4hmax` result is
        # folded in by the next group's first bundle (and once after the loop).
        mov $m7, $m2
        sethi $a2, 0xFF800
        sethi $a3, 0xFF800
        rpt $m5, 2
        { ld64 $a0:1, [$m7]+=8 ; f32max $a3, $a3, $a2 }
        f16v4hmax $a2, $a0:1
        f32max $a3, $a3, $a2
        rpt $m6, 3
        ld16 $a0, [$m7]+=2
        f16v2tof32 $a0:1, $a0
        f32max $a3, $a3, $a0
        f32mul $a3, $a3, $a12
        f32v2bcast $a14:15, $a3

        # Pass 2: sum of exp(t - m) in f32.
        mov $m7, $m2
        setzi $a10, 0
        setzi $a11, 0
        rpt $m5, 11
        ld64 $a0:1, [$m7]+=8
        EXP4
        f32v2add $a10:11, $a10:11, $a2:3
        f32v2add $a10:11, $a10:11, $a4:5
        rpt $m6, 6
        ld16 $a0, [$m7]+=2
        EXP1
        f32add $a10, $a10, $a0
        f32v2hsum $a10, $a10:11
        f32recip $a10, $a10
        f32v2bcast $a10:11, $a10

        # Pass 3: y = f16(exp(t - m) * recip(sum)).
        mov $m7, $m2
        mov $m8, $m3
        rpt $m5, 14
        ld64 $a0:1, [$m7]+=8
        EXP4
        f32v2mul $a2:3, $a2:3, $a10:11
        f32v2mul $a4:5, $a4:5, $a10:11
        f32v2tof16 $a6, $a2:3
        f32v2tof16 $a7, $a4:5
        st64 $a6:7, [$m8]+=8
        rpt $m6, 9
        ld16 $a0, [$m7]+=2
        EXP1
        f32mul $a0, $a0, $a10
        setzi $a1, 0
        f32v2tof16 $a0, $a0:1
        st16 $a0, [$m8]+=2
        add $m2, $m2, $m9
        add $m3, $m3, $m10
        brnzdec $m4, row
        exit
