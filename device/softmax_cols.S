# Exponentials down the columns of an f16 [ROWS, 4*QUADS] matrix, for the
# transposed attention layout: S^T = K Q^T (keys are rows, a tile's queries
# are columns) from gemm_f16 ACC=16, so the softmax over keys runs down each
# column. This kernel writes the unnormalised P^T (f16, keys x queries, the
# B operand of the P V GEMM) and the column maxima m; the column sums and
# the division by them happen elsewhere (not in this kernel).
#
# Vertex state (u32 words, byte offsets):
#    0 IN      address of IN[0, 0] (f16, 8-aligned, any region)
#    4 RS_IN   input row stride in bytes (multiple of 8)
#    8 OUT     address of OUT[0, 0] (f16, 8-aligned); may equal IN (with
#              RS_OUT = RS_IN): each row of a quad is loaded before the
#              row is written
#   12 RS_OUT  output row stride in bytes (multiple of 8)
#   16 ROWS    rows (>= 0; with 0 rows only MOUT is written)
#   20 QUADS   groups of four columns (>= 1)
#   24 MAXES   W rows of 4*QUADS f16, 8*QUADS bytes apart (8-aligned): the
#              OUT rows of W colmax_f16 vertices, the partial maxima
#   28 W       partial maxima (>= 1)
#   32 SCALE   f32 bits of the scale (> 0, e.g. 1/sqrt(d) in attention)
#   36 MOUT    address of 4*QUADS f32 (8-aligned) receiving m, or 0: not
#              written
#   40 SCRATCH this vertex's own 8*QUADS+16 bytes (8-aligned); only the
#              first 8 are used: the quad (-m) being worked on
#
# Semantics, bit for bit, all f16 except MOUT (each step one instruction,
# results rounded once to nearest even from the exact value computed in
# f64, docs/isa.md):
#     s16   = f16(SCALE)                               f32v2tof16
#     mx[c] = left fold of max over MAXES[0..W][c]     f16v4max, from -inf,
#             (a NaN gives 0x7E00; of equal values, +0 and -0 included,
#             the running maximum, i.e. the earlier one, is kept)
#     m[c]  = f16(mx[c] * s16)                          f16v4mul
#     n[c]  = -m[c]  (sign bit flipped)                 f16v4neg
#     t     = f16(n[c] + IN[r][c] * s16)  (in f64: n + x * s16, one rounding)
#                                                       f16v4mac onto n
#     OUT[r][c] = f16(exp(t))  (exp in f64, one rounding)  f16v4exp
#     MOUT[c]   = f32(m[c])    (exact)                  f16v2tof32
# so `t` is the scaled score minus the column maximum with one rounding and
# every OUT value is in [0, 1] up to rounding (exactly 1 where the scaled
# input rounds to m). SCALE must be positive (the maximum is taken on raw
# values and scaled once, equal to the maximum of the scaled values only for
# a monotone scale) and f16(mx * s16) must be finite (otherwise t is -inf or
# NaN).
#
# Each worker runs its own vertex: the compiler starts six colmax_f16
# vertices over row ranges of a tile's S^T, then six softmax_cols vertices
# over row ranges, each reading all W partial maxima (they agree on m, so
# one of them, any, is given a nonzero MOUT).
#
# Loop order: quad by quad, down the whole column (`ld64` with the row
# stride as register increment), so the per-quad work (folding the W
# maxima, m, MOUT) is paid once per quad and (-m) stays at one SCRATCH
# address. f16v4mac overwrites its accumulator, so (-m) is reloaded from
# SCRATCH for every row. Per row and quad: load x, load (-m), store p on the
# main slot; mac (1 slot) and exp (2 slots) on the arithmetic slot.
#   Fast path: the (-m) reload and the store of the previous row's p are one
#     `ld64st64` (load from SCRATCH, store to OUT), so a row takes two
#     bundles, { ld64 x ; mac } and { ld64st64 ; exp }: 3 issue slots. It
#     needs ROWS >= 2, RS_OUT < 32768 (the stride is the signed low half of
#     the stride register) and SCRATCH in a memory element (16 KiB standard,
#     32 KiB interleaved) that holds no byte of OUT's rows, since one
#     instruction's load and store must hit different elements.
#   Slow path (otherwise): { ld64 x ; mac }, { ld64 (-m) ; exp }, { st64 p }:
#     4 issue slots per row.

        .kernel softmax_cols
        .workers 6
        # The fast path's bundle count with MOUT = 0 (launch not included):
        # 45 bundles of entry, placement checks and `exit` (43 when SCRATCH
        # lies below OUT); per quad 12 + W around the rows (the head: fold
        # of the W maxima, m, (-m); pipeline fill and drain; pointer
        # updates) and 3 issue slots per row. MOUT adds 2 per quad. The
        # slow path takes at most 6 * (45 + QUADS * (10 + W + 4 * ROWS)),
        # 0 rows 6 * (16 + QUADS * (9 + W)).
        .cycles "6 * (45 + QUADS * (12 + W + 3 * ROWS))"

        .equ ST_IN, 0
        .equ ST_RS_IN, 4
        .equ ST_OUT, 8
        .equ ST_RS_OUT, 12
        .equ ST_ROWS, 16
        .equ ST_QUADS, 20
        .equ ST_MAXES, 24
        .equ ST_W, 28
        .equ ST_SCALE, 32
        .equ ST_MOUT, 36
        .equ ST_SCRATCH, 40

# Registers after the entry: $m0 walk over the W maxima of a quad, $m1 the
# row loop count, $m2 input quad (IN + 8 q), $m3 output quad (OUT + 8 q),
# $m4 RS_IN, $m5 RS_OUT (the stride register of `ld64st64`), $m6 quads
# left - 1, $m7 MAXES + 8 q, $m8 8 * QUADS, $m9 W, $m10 MOUT walk (or 0),
# $m11 input walk, $m12 SCRATCH and $m13 output walk (consecutive, as
# `ld64st64` needs). $a0:1 x, $a2:3 (-m) and then t, $a4:5 p, $a6:7 the quad
# s16 x 4, $a8:11 the maxima, $a14:15 the quad (-inf) x 4.

        .text
        .globl softmax_cols
        .entry softmax_cols

# The element key of the address in \a into \k (\t a temporary), as in
# device/copy64.S: the element index, offset by 0x800 for interleaved
# memory (from 0x80000), so that keys are monotonic in the address and the
# two regions never compare equal.
        .macro ELEMENT k, a, t
        setzi \t, 0x80000
        cmpult \t, \a, \t
        brz \t, elem_r1\@
        shr \k, \a, 14
        br elem_end\@
elem_r1\@:
        shr \k, \a, 15
        or \k, \k, 0x800
elem_end\@:
        .endm

# The per-quad head: mx = fold of the W maxima, m = f16(mx * s16), (-m)
# into $a2:3 and SCRATCH, m as f32 into MOUT when it is nonzero. With
# LOAD=1 it also points the walks at the quad and loads its first row into
# $a0:1 (not with 0 rows: IN may then point anywhere).
        .macro HEAD load
        { mov $m0, $m7 ; mov64 $a10:11, $a14:15 }
        { add $m7, $m7, 8 ; mov64 $a8:9, $a14:15 }
        rpt $m9, 1
        { ld64 $a8:9, [$m0]+=$m8 ; f16v4max $a10:11, $a10:11, $a8:9 }
        .if \load
        { mov $m11, $m2 ; f16v4max $a10:11, $a10:11, $a8:9 }
        { mov $m13, $m3 ; f16v4mul $a10:11, $a10:11, $a6:7 }
        { ld64 $a0:1, [$m11]+=$m4 ; f16v4neg $a2:3, $a10:11 }
        .else
        f16v4max $a10:11, $a10:11, $a8:9
        f16v4mul $a10:11, $a10:11, $a6:7
        f16v4neg $a2:3, $a10:11
        .endif
        { st64 $a2:3, [$m12] ; f16v2tof32 $a8:9, $a10 }
        brz $m10, head_done\@
        { st64 $a8:9, [$m10]+=8 ; f16v2tof32 $a8:9, $a11 }
        st64 $a8:9, [$m10]+=8
head_done\@:
        .endm

softmax_cols:
        setzi $a14, 0xFC00
        ld32 $m2, [$m0 + ST_IN]
        ld32 $m4, [$m0 + ST_RS_IN]
        ld32 $m3, [$m0 + ST_OUT]
        ld32 $m5, [$m0 + ST_RS_OUT]
        ld32 $m1, [$m0 + ST_ROWS]
        ld32 $m6, [$m0 + ST_QUADS]
        ld32 $m7, [$m0 + ST_MAXES]
        ld32 $m9, [$m0 + ST_W]
        { ld32 $a6, [$m0 + ST_SCALE] ; f16v4bcast $a14:15, $a14 }
        # $a7 starts at 0, so the conversion's second lane is harmless.
        { ld32 $m10, [$m0 + ST_MOUT] ; f32v2tof16 $a6, $a6:7 }
        { ld32 $m12, [$m0 + ST_SCRATCH] ; f16v4bcast $a6:7, $a6 }
        shl $m8, $m6, 3
        add $m6, $m6, -1
        brz $m1, quad_rows0
        # Fast path checks: ROWS >= 2, RS_OUT < 2^15, and SCRATCH's element
        # outside the element keys of OUT's first and last bytes.
        cmpult $m11, $m1, 2
        brnz $m11, slow
        shr $m11, $m5, 15
        brnz $m11, slow
        add $m11, $m1, -1
        mul $m11, $m11, $m5
        add $m11, $m11, $m3
        add $m11, $m11, $m8
        add $m11, $m11, -1
        ELEMENT $m13, $m11, $m0
        ELEMENT $m11, $m3, $m0
        ELEMENT $m14, $m12, $m0
        cmpult $m0, $m14, $m11
        brnz $m0, fast
        cmpult $m0, $m13, $m14
        brnz $m0, fast

slow:
        # 4 issue slots per row: the (-m) reload, the store and the load of
        # the next row each take their own bundle.
        add $m1, $m1, -1
quad_slow:
        HEAD 1
        rpt $m1, 3
        { ld64 $a0:1, [$m11]+=$m4 ; f16v4mac $a2:3, $a0:1, $a6:7 }
        { ld64 $a2:3, [$m12] ; f16v4exp $a4:5, $a2:3 }
        st64 $a4:5, [$m13]+=$m5
        { add $m2, $m2, 8 ; f16v4mac $a2:3, $a0:1, $a6:7 }
        { add $m3, $m3, 8 ; f16v4exp $a4:5, $a2:3 }
        st64 $a4:5, [$m13]+=$m5
        brnzdec $m6, quad_slow
        exit

fast:
        # 3 issue slots per row. Row 0's p is computed before the loop (the
        # loop's `ld64st64` stores the previous row's p), and the last row
        # after it (the loop loads the next row's x): no access outside
        # IN's and OUT's rows.
        add $m1, $m1, -2
quad_fast:
        HEAD 1
        { ld64 $a0:1, [$m11]+=$m4 ; f16v4mac $a2:3, $a0:1, $a6:7 }
        { ld64 $a2:3, [$m12] ; f16v4exp $a4:5, $a2:3 }
        rpt $m1, 2
        { ld64 $a0:1, [$m11]+=$m4 ; f16v4mac $a2:3, $a0:1, $a6:7 }
        # $m12 no increment (pace 3), $m13 by RS_OUT (pace 1): 3 | 1 << 2.
        { ld64st64 $a2:3, $a4:5, $m12, $m5, 7 ; f16v4exp $a4:5, $a2:3 }
        { add $m2, $m2, 8 ; f16v4mac $a2:3, $a0:1, $a6:7 }
        { st64 $a4:5, [$m13]+=$m5 ; f16v4exp $a4:5, $a2:3 }
        add $m3, $m3, 8
        st64 $a4:5, [$m13]+=$m5
        brnzdec $m6, quad_fast
        exit

quad_rows0:
        # No rows: only m (MOUT).
        HEAD 0
        brnzdec $m6, quad_rows0
        exit
