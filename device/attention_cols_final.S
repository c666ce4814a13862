# Combine and final normalisation of transposed flash attention (issue 5).
# Each key split i < N left an unnormalised O^T_i (f32 rows: row d < D =
# head column d, columns = the tile's 4*CQ queries, the first QN real) with
# one extra row LROW holding l_i[q], and its per-query maximum m_i[q]. For
# every query q < QN and head column d in [D0, D0 + DN):
#   mm = max_i m_i[q]                       (f32v2max, split order)
#   a_i = exp(f32(m_i[q] - mm))             (f32 subtract, exp rounded once)
#   l = a_0 l_0[q], then l = fma(a_i, l_i[q], l) for i = 1.. (fused f32v2mac,
#       one rounding each, split order)
#   r = recip(l)                            (rounded once to f32)
#   o = a_0 O^T_0[d][q], then o = fma(a_i, O^T_i[d][q], o) for i = 1..
#   out[q][d] = f16(f32(o * r))             (nearest even)
# With N = 1 the kernel reads neither M nor exp: a_0 = exp(0) = 1 exactly,
# so o = O^T_0[d][q] and l = l_0[q] (plain normalisation, bit for bit the
# same as the formula for finite m).
#
# Vertex state (u32 words, byte offsets):
#    0 OT       address of O^T_0[0][0] (f32, 8-aligned)
#    4 RS_OT    O^T row stride in bytes (multiple of 8)
#    8 SPLIT    bytes from O^T_i to O^T_{i+1} (multiple of 8)
#   12 N        splits (1..8)
#   16 M       address of m_0[0] (f32, 8-aligned); m_i at M + i * 16*CQ
#   20 LROW     the row of O^T_i holding l_i
#   24 CQ       query column quads (>= 1)
#   28 QN       queries to write (1..4*CQ)
#   32 D0       first head column of this vertex (even)
#   36 DN       head columns of this vertex (even, >= 2)
#   40 OUT      address of out[0][0] (f16 row-major [QN, ...], 4-aligned);
#               out[q][d] at OUT + q*RS_OUT + 2*d
#   44 RS_OUT   output row stride in bytes (multiple of 4)
#   48 SCRATCH  this vertex's own scratch (8-aligned): N = 3 and 4 store
#               the first query pair's two dummy halves there (2 bytes, the
#               rotated loop's stores of "the row before the first");
#               N >= 5 keeps a_2 .. a_{N-1} of the current query pair there
#               (8*(N-2) <= 48 bytes); N = 1, 2 do not touch it
#
# Only out[q][D0 .. D0+DN) for q < QN is written. Padding queries (columns
# QN .. 4*CQ) are read and computed in the idle lane of the last query pair,
# never stored. Each worker runs its own vertex over its own range of head
# columns or of queries (OT, M and OUT then point at its first query, an
# even one); every vertex recomputes the per-query factors it needs.
#
# Method: f32v2 lanes are a query pair (q, q+1); a row of O^T is one ld64.
# Per query pair the factors (a_i pairs, the r pair) are computed into
# registers, then a hardware loop walks the head-column pairs (d, d+1): two
# rows give o for 2 x 2 outputs, f32v2tof16 makes (q, q+1) halves of row d
# and of row d+1, and pack16lo/pack16hi turn them into the (d, d+1) word of
# query q and of query q+1, one st32 each. Issue slots per 4 outputs:
# N = 1: 6 (mul by r x2, convert x2, pack x2); N = 2: 10 (mul, mac,
# mul by r per row, then convert and pack), the arithmetic slot full; the
# four ld64 and two st32 ride in the main slot. The loop body is rotated:
# an iteration finishes the previous column pair (scale, convert, pack,
# store) while it loads and sums the current one.
#
# N = 3 and N = 4 take one head-column row at a time: the a_i pairs, the r
# pair, the o pair, the loaded row, the f16 pair and its high half fill
# the 16 $a registers exactly at N = 4 (2N + 2 + 2 + 2 + 2). Per row:
# mul + (N - 1) mac + mul by r + f32v2tof16 + pack16hi (high half to the
# low 16 bits) = N + 3 arithmetic slots; N ld64 + two st16 ride in the
# main slot. That is 2N + 6 per four outputs, the same as the bound of the
# paired (pack16lo + pack16hi + st32) form, with half the registers
# (the paired form needs two o pairs plus two more in flight). There is
# no latency to hide (a result is ready for the next bundle), so the only
# rotation is the single load register: every bundle loads the row that
# the next bundle's mac reads, and the stores of row d - 1 ride with row
# d's scale and convert (the first row of a query pair is peeled, its
# last row is stored at the start of the next pair or after the loop).
# Per query pair the factors take 5N + 6 bundles (max chain, sub, exp at
# 2 slots, the l sums, recip at 2 slots, loop setup) plus (N + 3) per row.
# N >= 5 runs a general loop (3 issue slots per split per 4 outputs, a_i
# from SCRATCH): its a_i pairs do not fit in registers next to the rest.
# The odd last query (QN odd) stores its idle lane's result first and the
# real one second to the same address (a word, or with N = 3, 4 a half), so
# no byte outside the QN rows changes.
#
# Cycles per vertex (QP = query pairs, RP = head-column pairs; indicator
# terms pick the path: 2/(N+1) is 1 for N = 1, (N+5)/8 - (N+3)/8 is 1 for
# N = 3, 4 and (N+3)/8 is 1 for N >= 5), exact to the bundle:
#   N = 1:     27 + QP * (10 + 6 RP)
#   N = 2:     29 + QP * (16 + 10 RP)
#   N = 3, 4:  3N + 30 + QP * (5N + 6 + (N + 3) DN)
#   N >= 5:    34 + QP * (30 + 7N + (13 + 3N) RP)
        .kernel attention_cols_final
        .workers 6
        .cycles "6 * (29 - 2 * (2 / (N + 1)) + ((N + 5) / 8 - (N + 3) / 8) * (3 * N + 1) + 5 * ((N + 3) / 8) + ((QN + 1) / 2) * ((2 / (N + 1)) * (10 + 6 * (DN / 2)) + (1 - 2 / (N + 1) - (N + 5) / 8) * (16 + 10 * (DN / 2)) + ((N + 5) / 8 - (N + 3) / 8) * (5 * N + 6 + (N + 3) * DN) + ((N + 3) / 8) * (30 + 7 * N + (13 + 3 * N) * (DN / 2))))"

        .equ ST_OT, 0
        .equ ST_RS_OT, 4
        .equ ST_SPLIT, 8
        .equ ST_N, 12
        .equ ST_M, 16
        .equ ST_LROW, 20
        .equ ST_CQ, 24
        .equ ST_QN, 28
        .equ ST_D0, 32
        .equ ST_DN, 36
        .equ ST_OUT, 40
        .equ ST_RS_OUT, 44
        .equ ST_SCRATCH, 48

# Registers of the N = 1 and N = 2 paths: $m1 column pairs - 1 (the rpt
# count), $m2 RS_OT, $m3 SPLIT, $m4 O^T walk (row d of split 0), $m5 O^T at
# row D0 and column q, $m6 (LROW - D0) * RS_OT, $m7 m_0 at column q, $m8
# 16*CQ (m_i stride), $m9 out[q][D0], $m10 out walk of query q, $m11 of
# query q+1, $m12 RS_OUT, $m13 out[QN-1][D0], $m14 query pairs left - 1.
# $a0:1, $a2:3 o of rows d and d+1 (then their f16 halves and packed words),
# $a4:5, $a6:7, $a8:9 rows loaded from O^T, $a10:11 and $a12:13 the pairs
# a_0 and a_1, $a14:15 the pair r.
        .text
        .globl attention_cols_final
        .entry attention_cols_final
attention_cols_final:
        ld32 $m2, [$m0 + ST_RS_OT]
        ld32 $m3, [$m0 + ST_SPLIT]
        ld32 $m5, [$m0 + ST_OT]
        ld32 $m4, [$m0 + ST_D0]
        mul $m6, $m4, $m2
        add $m5, $m5, $m6
        ld32 $m6, [$m0 + ST_LROW]
        sub $m6, $m6, $m4
        mul $m6, $m6, $m2
        ld32 $m7, [$m0 + ST_M]
        ld32 $m8, [$m0 + ST_CQ]
        shl $m8, $m8, 4
        ld32 $m9, [$m0 + ST_OUT]
        add $m9, $m9, $m4
        add $m9, $m9, $m4
        ld32 $m12, [$m0 + ST_RS_OUT]
        ld32 $m14, [$m0 + ST_QN]
        add $m14, $m14, -1
        mul $m13, $m14, $m12
        add $m13, $m13, $m9
        shr $m14, $m14, 1
        ld32 $m1, [$m0 + ST_DN]
        shr $m1, $m1, 1
        add $m1, $m1, -1
        ld32 $m10, [$m0 + ST_N]
        add $m10, $m10, -1
        brz $m10, n1_pair
        add $m10, $m10, -1
        brz $m10, n2_pair
        add $m10, $m10, -1
        brz $m10, n3_start
        add $m10, $m10, -1
        brz $m10, n4_start
        br ng_pair

# ---- N = 1: r = recip(l_0), out = f16(O^T_0 * r) ----
n1_pair:
        add $m4, $m5, $m6
        ld64 $a0:1, [$m4]
        { mov $m4, $m5 ; f32v2recip $a14:15, $a0:1 }
        ld64 $a4:5, [$m4]+=$m2
        { ld64 $a6:7, [$m4]+=$m2 ; f32v2mul $a0:1, $a4:5, $a14:15 }
        { add $m11, $m9, $m12 ; f32v2mul $a2:3, $a6:7, $a14:15 }
        min $m11, $m11, $m13
        mov $m10, $m9
        rpt $m1, 6
        { ld64 $a4:5, [$m4]+=$m2 ; f32v2tof16 $a0, $a0:1 }
        { ld64 $a6:7, [$m4]+=$m2 ; f32v2tof16 $a2, $a2:3 }
        pack16hi $a3, $a0, $a2
        { st32 $a3, [$m11]+=4 ; pack16lo $a1, $a0, $a2 }
        { st32 $a1, [$m10]+=4 ; f32v2mul $a0:1, $a4:5, $a14:15 }
        f32v2mul $a2:3, $a6:7, $a14:15
        { add $m5, $m5, 8 ; f32v2tof16 $a0, $a0:1 }
        { add $m9, $m9, $m12 ; f32v2tof16 $a2, $a2:3 }
        { add $m9, $m9, $m12 ; pack16hi $a3, $a0, $a2 }
        { st32 $a3, [$m11] ; pack16lo $a1, $a0, $a2 }
        st32 $a1, [$m10]
        brnzdec $m14, n1_pair
        exit

# ---- N = 2: the factors in registers, 10 bundles per 4 outputs ----
n2_pair:
        ld64 $a4:5, [$m7]
        ld64 $a6:7, [$m7 + $m8]
        { add $m4, $m5, $m6 ; f32v2max $a8:9, $a4:5, $a6:7 }
        { ld64 $a0:1, [$m4] ; f32v2sub $a4:5, $a4:5, $a8:9 }
        { ld64 $a2:3, [$m4 + $m3] ; f32v2sub $a6:7, $a6:7, $a8:9 }
        { mov $m4, $m5 ; f32v2exp $a10:11, $a4:5 }
        { mov $m10, $m9 ; f32v2exp $a12:13, $a6:7 }
        { ld64 $a6:7, [$m4 + $m3] ; f32v2mul $a0:1, $a0:1, $a10:11 }
        { ld64 $a4:5, [$m4]+=$m2 ; f32v2mac $a0:1, $a2:3, $a12:13 }
        { ld64 $a8:9, [$m4 + $m3] ; f32v2recip $a14:15, $a0:1 }
        { add $m11, $m9, $m12 ; f32v2mul $a0:1, $a4:5, $a10:11 }
        { ld64 $a4:5, [$m4]+=$m2 ; f32v2mac $a0:1, $a6:7, $a12:13 }
        { min $m11, $m11, $m13 ; f32v2mul $a2:3, $a4:5, $a10:11 }
        { add $m7, $m7, 8 ; f32v2mac $a2:3, $a8:9, $a12:13 }
        rpt $m1, 10
        { ld64 $a6:7, [$m4 + $m3] ; f32v2mul $a0:1, $a0:1, $a14:15 }
        { ld64 $a4:5, [$m4]+=$m2 ; f32v2mul $a2:3, $a2:3, $a14:15 }
        { ld64 $a8:9, [$m4 + $m3] ; f32v2tof16 $a0, $a0:1 }
        f32v2tof16 $a2, $a2:3
        pack16hi $a3, $a0, $a2
        { st32 $a3, [$m11]+=4 ; pack16lo $a1, $a0, $a2 }
        { st32 $a1, [$m10]+=4 ; f32v2mul $a0:1, $a4:5, $a10:11 }
        { ld64 $a4:5, [$m4]+=$m2 ; f32v2mac $a0:1, $a6:7, $a12:13 }
        f32v2mul $a2:3, $a4:5, $a10:11
        f32v2mac $a2:3, $a8:9, $a12:13
        { add $m5, $m5, 8 ; f32v2mul $a0:1, $a0:1, $a14:15 }
        { add $m9, $m9, $m12 ; f32v2mul $a2:3, $a2:3, $a14:15 }
        { add $m9, $m9, $m12 ; f32v2tof16 $a0, $a0:1 }
        f32v2tof16 $a2, $a2:3
        pack16hi $a3, $a0, $a2
        { st32 $a3, [$m11] ; pack16lo $a1, $a0, $a2 }
        st32 $a1, [$m10]
        brnzdec $m14, n2_pair
        exit

# ---- N = 3 and N = 4: one head-column row at a time, N + 3 bundles ----
# Registers: $m0 STEP = RS_OT - (N-1)*SPLIT (the state is read up front),
# $m1 DN - 1 (the rpt count: the first row of a query pair is peeled),
# $m4 O^T walk (split i of row d), $m10 / $m11 out walks of queries q /
# q+1 (they start at SCRATCH, where the first pair's leading stores go),
# the rest as in the N = 1, 2 paths. $a0:1 o of the row in flight, $a2:3
# the O^T row just loaded, $a4:5, $a6:7, $a8:9 (, $a10:11) the pairs a_0
# .. a_{N-1}, $a12:13 the pair r, $a14 the f16 pair (q, q+1) of the last
# finished row and $a15 its q+1 half moved to the low 16 bits.
n3_start:
        ld32 $m1, [$m0 + ST_DN]
        add $m1, $m1, -1
        ld32 $m10, [$m0 + ST_SCRATCH]
        mov $m11, $m10
        sub $m0, $m2, $m3
        sub $m0, $m0, $m3
n3_pair:
        mov $m4, $m7
        ld64 $a4:5, [$m4]+=$m8
        ld64 $a6:7, [$m4]+=$m8
        { ld64 $a8:9, [$m4]+=$m8 ; f32v2max $a0:1, $a4:5, $a6:7 }
        { add $m4, $m5, $m6 ; f32v2max $a0:1, $a0:1, $a8:9 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2sub $a4:5, $a4:5, $a0:1 }
        # The previous pair's last row (the first pair's go to SCRATCH).
        { st16 $a15, [$m11] ; f32v2sub $a6:7, $a6:7, $a0:1 }
        { st16 $a14, [$m10] ; f32v2sub $a8:9, $a8:9, $a0:1 }
        { mov $m10, $m9 ; f32v2exp $a4:5, $a4:5 }
        # out walk of query q+1: the same as q's for the odd last query.
        { add $m11, $m9, $m12 ; f32v2exp $a6:7, $a6:7 }
        { min $m11, $m11, $m13 ; f32v2exp $a8:9, $a8:9 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mul $a0:1, $a2:3, $a4:5 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a6:7 }
        { mov $m4, $m5 ; f32v2mac $a0:1, $a2:3, $a8:9 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2recip $a12:13, $a0:1 }
        # Row D0, not stored yet (the loop stores each row one row later).
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mul $a0:1, $a2:3, $a4:5 }
        { ld64 $a2:3, [$m4]+=$m0 ; f32v2mac $a0:1, $a2:3, $a6:7 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a8:9 }
        { add $m5, $m5, 8 ; f32v2mul $a0:1, $a0:1, $a12:13 }
        # (m11 is past the last row only where no pair follows.)
        { add $m9, $m11, $m12 ; f32v2tof16 $a14, $a0:1 }
        { add $m7, $m7, 8 ; pack16hi $a15, $a14, $a14 }
        rpt $m1, 6
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mul $a0:1, $a2:3, $a4:5 }
        { ld64 $a2:3, [$m4]+=$m0 ; f32v2mac $a0:1, $a2:3, $a6:7 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a8:9 }
        { st16 $a15, [$m11]+=2 ; f32v2mul $a0:1, $a0:1, $a12:13 }
        { st16 $a14, [$m10]+=2 ; f32v2tof16 $a14, $a0:1 }
        pack16hi $a15, $a14, $a14
        brnzdec $m14, n3_pair
        st16 $a15, [$m11]
        st16 $a14, [$m10]
        exit

n4_start:
        ld32 $m1, [$m0 + ST_DN]
        add $m1, $m1, -1
        ld32 $m10, [$m0 + ST_SCRATCH]
        mov $m11, $m10
        sub $m0, $m2, $m3
        sub $m0, $m0, $m3
        sub $m0, $m0, $m3
n4_pair:
        mov $m4, $m7
        ld64 $a4:5, [$m4]+=$m8
        ld64 $a6:7, [$m4]+=$m8
        { ld64 $a8:9, [$m4]+=$m8 ; f32v2max $a0:1, $a4:5, $a6:7 }
        { ld64 $a10:11, [$m4]+=$m8 ; f32v2max $a0:1, $a0:1, $a8:9 }
        { add $m4, $m5, $m6 ; f32v2max $a0:1, $a0:1, $a10:11 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2sub $a4:5, $a4:5, $a0:1 }
        { st16 $a15, [$m11] ; f32v2sub $a6:7, $a6:7, $a0:1 }
        { st16 $a14, [$m10] ; f32v2sub $a8:9, $a8:9, $a0:1 }
        { mov $m10, $m9 ; f32v2sub $a10:11, $a10:11, $a0:1 }
        { add $m11, $m9, $m12 ; f32v2exp $a4:5, $a4:5 }
        { min $m11, $m11, $m13 ; f32v2exp $a6:7, $a6:7 }
        f32v2exp $a8:9, $a8:9
        f32v2exp $a10:11, $a10:11
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mul $a0:1, $a2:3, $a4:5 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a6:7 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a8:9 }
        { mov $m4, $m5 ; f32v2mac $a0:1, $a2:3, $a10:11 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2recip $a12:13, $a0:1 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mul $a0:1, $a2:3, $a4:5 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a6:7 }
        { ld64 $a2:3, [$m4]+=$m0 ; f32v2mac $a0:1, $a2:3, $a8:9 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a10:11 }
        { add $m5, $m5, 8 ; f32v2mul $a0:1, $a0:1, $a12:13 }
        { add $m9, $m11, $m12 ; f32v2tof16 $a14, $a0:1 }
        { add $m7, $m7, 8 ; pack16hi $a15, $a14, $a14 }
        rpt $m1, 7
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mul $a0:1, $a2:3, $a4:5 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a6:7 }
        { ld64 $a2:3, [$m4]+=$m0 ; f32v2mac $a0:1, $a2:3, $a8:9 }
        { ld64 $a2:3, [$m4]+=$m3 ; f32v2mac $a0:1, $a2:3, $a10:11 }
        { st16 $a15, [$m11]+=2 ; f32v2mul $a0:1, $a0:1, $a12:13 }
        { st16 $a14, [$m10]+=2 ; f32v2tof16 $a14, $a0:1 }
        pack16hi $a15, $a14, $a14
        brnzdec $m14, n4_pair
        st16 $a15, [$m11]
        st16 $a14, [$m10]
        exit

# ---- N >= 5: general loops ----
# Registers: $m0 state (constants are reloaded from it), $m1 N - 2, $m2
# RS_OT, $m3 SPLIT, $m4 O^T walk (row d of split 0), $m5 O^T at row D0 and
# column q, $m6 / $m8 split walks of rows d / d+1, $m7 m_0 at column q, $m9
# out[q][D0], $m10 / $m11 out walks of queries q / q+1, $m12 a_i walk in
# SCRATCH, $m13 column pairs left - 1, $m14 query pairs left - 1. $a8:9 the
# pair a_i of the split in flight; otherwise as above.
ng_pair:
        ld32 $m10, [$m0 + ST_CQ]
        shl $m10, $m10, 4
        mov $m6, $m7
        ld64 $a8:9, [$m6]+=$m10
        ld32 $m1, [$m0 + ST_N]
        add $m1, $m1, -1
        rpt $m1, 2
        ld64 $a4:5, [$m6]+=$m10
        f32v2max $a8:9, $a8:9, $a4:5
        ld32 $m8, [$m0 + ST_LROW]
        ld32 $m4, [$m0 + ST_D0]
        sub $m8, $m8, $m4
        mul $m8, $m8, $m2
        add $m8, $m8, $m5
        mov $m6, $m7
        ld64 $a4:5, [$m6]+=$m10
        ld64 $a0:1, [$m8]+=$m3
        { ld32 $m12, [$m0 + ST_SCRATCH] ; f32v2sub $a4:5, $a4:5, $a8:9 }
        { add $m1, $m1, -1 ; f32v2exp $a10:11, $a4:5 }
        { ld64 $a4:5, [$m6]+=$m10 ; f32v2mul $a0:1, $a0:1, $a10:11 }
        { ld64 $a6:7, [$m8]+=$m3 ; f32v2sub $a4:5, $a4:5, $a8:9 }
        { mov $m4, $m5 ; f32v2exp $a12:13, $a4:5 }
        f32v2mac $a0:1, $a6:7, $a12:13
        rpt $m1, 4
        ld64 $a4:5, [$m6]+=$m10
        { ld64 $a6:7, [$m8]+=$m3 ; f32v2sub $a4:5, $a4:5, $a8:9 }
        f32v2exp $a4:5, $a4:5
        { st64 $a4:5, [$m12]+=8 ; f32v2mac $a0:1, $a6:7, $a4:5 }
        { mov $m10, $m9 ; f32v2recip $a14:15, $a0:1 }
        # out walk of query q+1: the same as q's for the odd last query.
        ld32 $m11, [$m0 + ST_RS_OUT]
        add $m11, $m11, $m9
        ld32 $m13, [$m0 + ST_QN]
        and $m13, $m13, 1
        cmpeq $m12, $m14, 0
        and $m13, $m13, $m12
        brz $m13, ng_rows
        mov $m11, $m9
ng_rows:
        ld32 $m13, [$m0 + ST_DN]
        shr $m13, $m13, 1
        add $m13, $m13, -1
ng_row:
        ld32 $m12, [$m0 + ST_SCRATCH]
        mov $m6, $m4
        add $m8, $m4, $m2
        ld64 $a4:5, [$m6]+=$m3
        ld64 $a6:7, [$m8]+=$m3
        { ld64 $a4:5, [$m6]+=$m3 ; f32v2mul $a0:1, $a4:5, $a10:11 }
        { ld64 $a6:7, [$m8]+=$m3 ; f32v2mul $a2:3, $a6:7, $a10:11 }
        { add $m4, $m4, $m2 ; mov64 $a8:9, $a12:13 }
        rpt $m1, 3
        { ld64 $a4:5, [$m6]+=$m3 ; f32v2mac $a0:1, $a4:5, $a8:9 }
        { ld64 $a8:9, [$m12]+=8 ; f32v2mac $a2:3, $a6:7, $a8:9 }
        ld64 $a6:7, [$m8]+=$m3
        { add $m4, $m4, $m2 ; f32v2mac $a0:1, $a4:5, $a8:9 }
        f32v2mac $a2:3, $a6:7, $a8:9
        f32v2mul $a0:1, $a0:1, $a14:15
        f32v2mul $a2:3, $a2:3, $a14:15
        f32v2tof16 $a0, $a0:1
        f32v2tof16 $a2, $a2:3
        pack16hi $a3, $a0, $a2
        { st32 $a3, [$m11]+=4 ; pack16lo $a1, $a0, $a2 }
        st32 $a1, [$m10]+=4
        brnzdec $m13, ng_row
        add $m5, $m5, 8
        add $m7, $m7, 8
        ld32 $m13, [$m0 + ST_RS_OUT]
        add $m9, $m9, $m13
        add $m9, $m9, $m13
        brnzdec $m14, ng_pair
        exit
