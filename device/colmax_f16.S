# Partial column maximum of an f16 [ROWS, 4*QUADS] matrix: OUT[c] =
# max_r IN[r][c], for the softmax down the columns of transposed attention
# scores (S^T = K Q^T: keys are rows, queries are columns; see
# device/softmax_cols.S, which folds W such partial maxima).
#
# Vertex state (u32 words, byte offsets):
#    0 IN     address of IN[0, 0] (f16, 8-aligned, any region)
#    4 RS_IN  input row stride in bytes (multiple of 8)
#    8 ROWS   rows (>= 1)
#   12 QUADS  groups of four columns (>= 1)
#   16 OUT    address of OUT[0] (f16 [4*QUADS], 8-aligned); must not
#             overlap IN
#
# Semantics, bit for bit, per column c (`f16v4max` lanes, docs/isa.md: a
# NaN operand gives the canonical NaN 0x7E00; of two equal values, +0 and
# -0 included, the FIRST operand is kept):
#     acc = max(-inf, -inf);  for r in 0..ROWS: acc = max(acc, IN[r][c]);
#     OUT[c] = acc,
# the left fold of the column starting from -inf (0xFC00; the first step
# comes from the software pipeline and keeps -inf): without NaNs the result
# is IN[r0][c] for the first row r0 holding the column's largest value.
#
# Why columns: the compiler computes S^T per tile with queries as columns,
# so the softmax over keys runs down each column; the rows of one tile are
# split over six colmax vertices (row ranges), whose W partial maxima
# softmax_cols folds. The loop walks down one quad of columns at a time
# (`ld64` with the row stride as a register increment) and keeps the running
# maximum of the quad in registers: one bundle per quad per row, the load of
# row r+1 paired with the maximum of row r.
#
# IN=32 (`-D IN=32`; the default IN=16 is everything above): IN is f32
# [ROWS, 4*QUADS] (8-aligned, any region, RS_IN a multiple of 8) and OUT is
# f32 [4*QUADS] (8-aligned, not overlapping IN): the scores of the S^T GEMM
# accumulated in f32 (gemm_f16 ACC=32), whose f16 rounding would move the
# exponent argument near the column maximum by 2^-11 |s * scale|. The same
# state words; per column, with `f32v2max` (a NaN operand gives the
# canonical NaN 0x7FC00000; of two equal values, +0 and -0 included, the
# FIRST operand is kept):
#     acc = -inf;  for r in 0..ROWS: acc = max(acc, IN[r][c]);  OUT[c] = acc.
# A quad is 16 bytes, two `ld64` per row (lanes 0-1 and 2-3, two walkers
# down the column): two bundles per quad per row, the 8 B per issue slot
# of `ld64`. Row 0 is loaded before the loop, so nothing outside IN's rows
# is read.

        .kernel colmax_f16
        .param IN, 16
        .workers 6
        .if IN != 16 && IN != 32
        .error "IN must be 16 (f16 input and maxima) or 32 (f32 input and maxima)"
        .endif
        .if IN == 32
        # Exact bundle count (launch not included): 11 bundles of entry and
        # one `exit`; per quad 8 around the hardware loop (pointer, the two
        # loads of row 0, rpt, the last two maxima, two st64, brnzdec) and
        # 2 per further row.
        .cycles "6 * (12 + QUADS * (6 + 2 * ROWS))"
        .else
        # Exact bundle count (launch not included): 7 bundles of entry and
        # one `exit`; per quad 6 around the hardware loop (mov, add, rpt,
        # the last maximum, st64, brnzdec) and one per row.
        .cycles "6 * (8 + QUADS * (6 + ROWS))"
        .endif

        .equ ST_IN, 0
        .equ ST_RS_IN, 4
        .equ ST_ROWS, 8
        .equ ST_QUADS, 12
        .equ ST_OUT, 16

# Registers: $m2 input quad (IN + 8 q), $m3 RS_IN, $m4 ROWS, $m5 quads left
# - 1, $m6 output walk, $m7 the walk down the quad's column. $a0:1 the
# loaded row, $a2:3 the running maximum, $a14:15 the quad (-inf) x 4.

        .text
        .globl colmax_f16
        .entry colmax_f16
colmax_f16:
        .if IN == 32
# IN=32 registers: $m7 the walk down lanes 0-1 of the quad's columns, $m8
# lanes 2-3 (= $m7 + 8), $m3 RS_IN, $m4 ROWS - 1, $m5 quads left - 1, $m6
# output walk, $m9 16 - ROWS * RS_IN (from the end of one quad's walk to
# the start of the next). $a0:1 and $a2:3 the loaded row, $a4:5 and $a6:7
# the running maxima, $a14:15 the pair (-inf) x 2.
        sethi $a14, 0xFF800
        ld32 $m7, [$m0 + ST_IN]
        ld32 $m3, [$m0 + ST_RS_IN]
        ld32 $m4, [$m0 + ST_ROWS]
        ld32 $m5, [$m0 + ST_QUADS]
        { ld32 $m6, [$m0 + ST_OUT] ; f32v2bcast $a14:15, $a14 }
        mul $m9, $m4, $m3
        setzi $m2, 16
        sub $m9, $m2, $m9
        add $m4, $m4, -1
        add $m5, $m5, -1
quad32:
        # Row 0 is loaded here; the loop loads row r+1 while folding row r.
        { add $m8, $m7, 8 ; mov64 $a4:5, $a14:15 }
        { ld64 $a0:1, [$m7]+=$m3 ; mov64 $a6:7, $a14:15 }
        ld64 $a2:3, [$m8]+=$m3
        rpt $m4, 2
        { ld64 $a0:1, [$m7]+=$m3 ; f32v2max $a4:5, $a4:5, $a0:1 }
        { ld64 $a2:3, [$m8]+=$m3 ; f32v2max $a6:7, $a6:7, $a2:3 }
        { add $m7, $m7, $m9 ; f32v2max $a4:5, $a4:5, $a0:1 }
        { st64 $a4:5, [$m6]+=8 ; f32v2max $a6:7, $a6:7, $a2:3 }
        st64 $a6:7, [$m6]+=8
        brnzdec $m5, quad32
        exit
        .else
        setzi $a14, 0xFC00
        ld32 $m2, [$m0 + ST_IN]
        ld32 $m3, [$m0 + ST_RS_IN]
        ld32 $m4, [$m0 + ST_ROWS]
        ld32 $m5, [$m0 + ST_QUADS]
        { ld32 $m6, [$m0 + ST_OUT] ; f16v4bcast $a14:15, $a14 }
        add $m5, $m5, -1
quad:
        # $a0:1 = -inf too: the loop's first maximum reads it before the
        # first load lands.
        { mov $m7, $m2 ; mov64 $a0:1, $a14:15 }
        { add $m2, $m2, 8 ; mov64 $a2:3, $a14:15 }
        rpt $m4, 1
        { ld64 $a0:1, [$m7]+=$m3 ; f16v4max $a2:3, $a2:3, $a0:1 }
        f16v4max $a2:3, $a2:3, $a0:1
        st64 $a2:3, [$m6]+=8
        brnzdec $m5, quad
        exit
        .endif
