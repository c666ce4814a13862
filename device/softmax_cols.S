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
#
# IN=32 (`-D IN=32`; the default IN=16 is everything above): f32 scores,
# from the S^T GEMM accumulated in f32 (gemm_f16 ACC=32). An f16 score s
# rounds by up to 2^-11 |s * scale|, an absolute error of the exponent's
# argument near the column maximum, where p is about 1: about the same
# relative error in p (0.5% at |s * scale| = 10).
# Here the scores stay f32 until the argument is formed; only t, already
# small near the maximum, is rounded to f16 (its error u |t| moves p by at
# most u/e in absolute terms). State words as above, except:
#    0 IN      f32 [ROWS, 4*QUADS], RS_IN: EXP=16 (the default) loads a
#              row's quad with one `ld128`, so IN is 16-aligned in
#              interleaved memory (region 1) and RS_IN a multiple of 16;
#              EXP=32 takes IN 8-aligned in any region, RS_IN a multiple
#              of 8
#    8 OUT     f16 [ROWS, 4*QUADS] as above (the next GEMM's B operand);
#              may equal IN with RS_OUT = RS_IN (a quad's f16 output lands
#              on input bytes of the same or an earlier quad, already read)
#   24 MAXES   W rows of 4*QUADS f32, 16*QUADS bytes apart (8-aligned): the
#              OUT rows of W colmax_f16 IN=32 vertices
#   40 SCRATCH this vertex's own 8*QUADS+16 bytes (8-aligned); the first 24
#              are used: the quad (-m) as f32 (16 bytes), then a sink for
#              the m stores when MOUT = 0
# Semantics, bit for bit (f32 results IEEE, nearest even; f16 results
# rounded once, nearest even, from the exact value):
#     mx[c] = left fold of max over MAXES[0..W][c]     f32v2max, from -inf
#             (a NaN gives 0x7FC00000; of equal values, +0 and -0
#             included, the running maximum, i.e. the earlier one, is kept)
#     m[c]  = f32(mx[c] * SCALE)  (SCALE as given)    f32v2mul
#     n[c]  = -m[c]  (sign bit flipped)               f32v2neg
#     a     = f32(n[c] + IN[r][c] * SCALE)  (fused, one rounding)
#                                                     f32v2mac onto n
#     t     = f16(a)                                  f32v2tof16
#     OUT[r][c] = f16(exp(t))  (exp in f64, one rounding)  f16v4exp
#     MOUT[c]   = m[c]  (f32)
# with the preconditions of IN=16: SCALE > 0 and m finite.
#   Cost: per row and quad the arithmetic is 2 f32v2mac, one f32v4tof16
#   and the 2-slot f16v4exp, 5 issue slots in 4 bundles; the main slot's 4
#   operations fit beside them: x as one `ld128` (hence IN in interleaved
#   memory, 16-aligned, RS_IN a multiple of 16, where gemm_f16 ACC=32
#   leaves its C rows), the (-m) reload as two ld64 since f32v2mac
#   overwrites its accumulator, the st64 of p. So there is no fast path to
#   choose and no placement check: `ld64st64` would save main slots that
#   are not the bound. (With two f32v2tof16 instead of f32v4tof16 a row
#   took 6 slots.) The row loop is software-pipelined (the
#   exp and store of row r-1 beside the loads and macs of row r), with row
#   0 before it and row ROWS-1's exp and store after it: nothing outside
#   IN's and OUT's rows is accessed. m is stored unconditionally (to MOUT,
#   or with a zero increment to SCRATCH + 16 when MOUT = 0), cheaper than
#   a branch per quad. ROWS = 0 with MOUT = 0 writes nothing.
#
# EXP=32 (`-D IN=32 -D EXP=32`; EXP=16, the default, is everything above;
# EXP=32 without IN=32 is an error): the argument stays f32 and the
# exponential is taken in f32. Rounding t to f16 moves p by up to u |t|
# relatively (u = 2^-11): several f16 ulps of p for arguments near -10,
# where p is small but still counts in the column sums. Here the only
# errors besides p's own f16 rounding are the f32 roundings of m, a and e,
# thousandths of an f16 ulp. State words, preconditions, MOUT and SCRATCH
# as IN=32. Semantics, bit for bit:
#     mx, m, n as IN=32
#     a     = f32(n[c] + IN[r][c] * SCALE)  (fused, one rounding)
#                                                     f32v2mac onto n
#     e     = f32(exp(a))  (exp in f64, one rounding)  f32v2exp
#     OUT[r][c] = f16(e)  (nearest even)             f32v2tof16
#     MOUT[c]   = m[c]  (f32)
#   Cost: per row and quad 2 f32v2mac, 2 f32v2exp (2 issue slots each)
#   and 2 f32v2tof16, 8 issue slots; the main slot's 5 operations fit in
#   the 6 bundles. The exponentials work in place (e overwrites a), so
#   the (-m) reloads wait for the conversions that last read the pairs
#   and the loop needs no registers beyond IN=32's.

        .kernel softmax_cols
        .param IN, 16
        .param EXP, 16
        .workers 6
        .if IN != 16 && IN != 32
        .error "IN must be 16 (f16 scores and maxima) or 32 (f32 scores and maxima)"
        .endif
        .if EXP != 16 && EXP != 32
        .error "EXP must be 16 (f16 exponent argument) or 32 (f32 argument and exponential)"
        .endif
        .if EXP == 32 && IN != 32
        .error "EXP=32 needs IN=32 (the f32 argument comes from f32 scores and maxima)"
        .endif
        .if IN == 32 && EXP == 32
        # As IN=32 below, with 8 issue slots per row instead of 6 (the two
        # f32v2exp take 2 slots each where the one f16v4exp took 2, and
        # the conversions stay); the pipeline's drain (the last row's
        # exponentials, conversions, store and the loop branch) is 8
        # slots where IN=32's was 4 and the head 2 bundles shorter, so the
        # per-quad overhead is the same 12 + 2 W. Entry, MOUT and 0 rows
        # as IN=32.
        .cycles "6 * (25 + QUADS * (12 + 2 * W + 8 * ROWS))"
        .elseif IN == 32
        # Exact bundle count (launch not included) with MOUT = 0 and ROWS
        # >= 1: 24 bundles of entry and one `exit` (MOUT != 0: 21 and
        # `exit`); per quad 12 + 2 W around the rows (the head: the fold
        # of the W maxima in 2 bundles each, m, (-m), the stores of m and
        # (-m), row 0 and the pipeline's drain) and 5 issue slots per row.
        # 0 rows: 6 * (21 + QUADS * (9 + 2 * W)) with MOUT, 6 * 21 without.
        .cycles "6 * (25 + QUADS * (12 + 2 * W + 5 * ROWS))"
        .else
        # The fast path's bundle count with MOUT = 0 (launch not included):
        # 45 bundles of entry, placement checks and `exit` (43 when SCRATCH
        # lies below OUT); per quad 12 + W around the rows (the head: fold
        # of the W maxima, m, (-m); pipeline fill and drain; pointer
        # updates) and 3 issue slots per row. MOUT adds 2 per quad. The
        # slow path takes at most 6 * (45 + QUADS * (10 + W + 4 * ROWS)),
        # 0 rows 6 * (16 + QUADS * (9 + W)).
        .cycles "6 * (45 + QUADS * (12 + W + 3 * ROWS))"
        .endif

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
        .if IN == 32
# IN=32 registers after the entry: $m0 walk over the W maxima of a quad, $m1
# ROWS - 1, $m2 the MOUT increment (8, or 0 for the sink), $m3 output quad
# (OUT + 8 q), $m4 RS_IN, $m5 RS_OUT, $m6 quads left - 1, $m7 MAXES + 16 q,
# $m8 16 * QUADS, $m9 W, $m10 MOUT walk (or SCRATCH + 16), $m11 input walk
# (across quads), $m12 SCRATCH, $m13 output walk, $m14 16 - ROWS * RS_IN
# (from the end of one quad's walk to the next quad). $a0:1 and $a2:3 x
# (lanes 0-1, 2-3) and the maxima being folded, $a4:5 and $a6:7 (-m) and
# then the f32 argument, $a8:9 the running maxima and m (lanes 0-1), then
# t (f16 x 4), $a10:11 the maxima and m (lanes 2-3), then p, $a12:13 the
# pair SCALE x 2, $a14:15 the pair (-inf) x 2.
        sethi $a14, 0xFF800
        ld32 $m11, [$m0 + ST_IN]
        ld32 $m4, [$m0 + ST_RS_IN]
        ld32 $m3, [$m0 + ST_OUT]
        ld32 $m5, [$m0 + ST_RS_OUT]
        ld32 $m1, [$m0 + ST_ROWS]
        ld32 $m6, [$m0 + ST_QUADS]
        ld32 $m7, [$m0 + ST_MAXES]
        ld32 $m9, [$m0 + ST_W]
        { ld32 $a12, [$m0 + ST_SCALE] ; f32v2bcast $a14:15, $a14 }
        ld32 $m10, [$m0 + ST_MOUT]
        { ld32 $m12, [$m0 + ST_SCRATCH] ; f32v2bcast $a12:13, $a12 }
        shl $m8, $m6, 4
        add $m6, $m6, -1
        mul $m14, $m1, $m4
        setzi $m2, 16
        sub $m14, $m2, $m14
        setzi $m2, 8
        brnz $m10, mout_given32
        # MOUT = 0: nothing at all to do without rows; else m goes to the
        # sink at SCRATCH + 16, without increment.
        brz $m1, done32
        add $m10, $m12, 16
        setzi $m2, 0
mout_given32:
        brz $m1, quad32_rows0
        add $m1, $m1, -1
quad32:
        # The head: fold the W maxima (lanes 0-1 lag one row behind lanes
        # 2-3 in the pipeline, so $a0:1 starts at -inf), m, -m.
        { mov $m0, $m7 ; mov64 $a8:9, $a14:15 }
        { add $m7, $m7, 16 ; mov64 $a10:11, $a14:15 }
        { mov $m13, $m3 ; mov64 $a0:1, $a14:15 }
        rpt $m9, 2
        { ld64 $a2:3, [$m0+8] ; f32v2max $a8:9, $a8:9, $a0:1 }
        { ld64 $a0:1, [$m0]+=$m8 ; f32v2max $a10:11, $a10:11, $a2:3 }
        # Row 0 interleaved with m and (-m): x loads, m to MOUT, (-m) to
        # SCRATCH (each stored before its mac overwrites it), the macs and
        # conversions, and the (-m) reloads for row 1.
        { ld64 $a2:3, [$m11+8] ; f32v2max $a8:9, $a8:9, $a0:1 }
        { ld64 $a0:1, [$m11]+=$m4 ; f32v2mul $a8:9, $a8:9, $a12:13 }
        { add $m3, $m3, 8 ; f32v2mul $a10:11, $a10:11, $a12:13 }
        { st64 $a8:9, [$m10]+=$m2 ; f32v2neg $a4:5, $a8:9 }
        { st64 $a4:5, [$m12+0] ; f32v2neg $a6:7, $a10:11 }
        { st64 $a6:7, [$m12+8] ; f32v2mac $a4:5, $a0:1, $a12:13 }
        { st64 $a10:11, [$m10]+=$m2 ; f32v2mac $a6:7, $a2:3, $a12:13 }
        .if EXP == 32
        # Rows 0..ROWS-2, 8 issue slots each: row r's exponentials (in
        # place: e overwrites a) and conversions beside row r+1's x loads
        # and (-m) reloads (each reload in the bundle whose conversion last
        # reads the pair, as reads precede writes), then row r's store
        # beside row r+1's macs. $a10:11 is free in the loop.
        rpt $m1, 6
        { ld64 $a2:3, [$m11+8] ; f32v2exp $a4:5, $a4:5 }
        { ld64 $a0:1, [$m11]+=$m4 ; f32v2exp $a6:7, $a6:7 }
        { ld64 $a4:5, [$m12+0] ; f32v2tof16 $a8, $a4:5 }
        { ld64 $a6:7, [$m12+8] ; f32v2tof16 $a9, $a6:7 }
        { st64 $a8:9, [$m13]+=$m5 ; f32v2mac $a4:5, $a0:1, $a12:13 }
        f32v2mac $a6:7, $a2:3, $a12:13
        # Row ROWS-1: its exponentials, conversions and store.
        { add $m11, $m11, $m14 ; f32v2exp $a4:5, $a4:5 }
        f32v2exp $a6:7, $a6:7
        f32v2tof16 $a8, $a4:5
        f32v2tof16 $a9, $a6:7
        st64 $a8:9, [$m13]+=$m5
        brnzdec $m6, quad32
        .else
        # Row 0's conversion (all four lanes in one slot) beside the
        # reload of (-m)'s lanes 0-1; lanes 2-3 come back in the loop.
        { ld64 $a4:5, [$m12+0] ; f32v4tof16 $a8:9, $a4:7 }
        # Rows 1..ROWS-1, 5 issue slots each (the 2-slot exp, two macs,
        # one conversion): row r's x as one 128-bit load, its macs and
        # conversion beside row r-1's exp, store and second (-m) reload.
        # Each (-m) reload follows the conversion that last read its pair
        # and precedes the mac that overwrites it.
        rpt $m1, 4
        { ld128 $a0:3, [$m11]+=$m4 ; f16v4exp $a10:11, $a8:9 }
        { ld64 $a6:7, [$m12+8] ; f32v2mac $a4:5, $a0:1, $a12:13 }
        { st64 $a10:11, [$m13]+=$m5 ; f32v2mac $a6:7, $a2:3, $a12:13 }
        { ld64 $a4:5, [$m12+0] ; f32v4tof16 $a8:9, $a4:7 }
        { add $m11, $m11, $m14 ; f16v4exp $a10:11, $a8:9 }
        st64 $a10:11, [$m13]+=$m5
        brnzdec $m6, quad32
        .endif
done32:
        exit

quad32_rows0:
        # No rows: only m, to MOUT (nonzero here).
        { mov $m0, $m7 ; mov64 $a8:9, $a14:15 }
        { add $m7, $m7, 16 ; mov64 $a10:11, $a14:15 }
        mov64 $a0:1, $a14:15
        rpt $m9, 2
        { ld64 $a2:3, [$m0+8] ; f32v2max $a8:9, $a8:9, $a0:1 }
        { ld64 $a0:1, [$m0]+=$m8 ; f32v2max $a10:11, $a10:11, $a2:3 }
        f32v2max $a8:9, $a8:9, $a0:1
        f32v2mul $a8:9, $a8:9, $a12:13
        { st64 $a8:9, [$m10]+=$m2 ; f32v2mul $a10:11, $a10:11, $a12:13 }
        st64 $a10:11, [$m10]+=$m2
        brnzdec $m6, quad32_rows0
        exit
        .else
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
        .endif
