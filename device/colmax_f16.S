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

        .kernel colmax_f16
        .workers 6
        # Exact bundle count (launch not included): 7 bundles of entry and
        # one `exit`; per quad 6 around the hardware loop (mov, add, rpt,
        # the last maximum, st64, brnzdec) and one per row.
        .cycles "6 * (8 + QUADS * (6 + ROWS))"

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
