# Flash-attention state update for one K/V block (online softmax, f32 state).
#
# For each query row i of this vertex, with s[j] = f32(S[i, j] * SCALE) over
# the keys j of the block that row i may see:
#   m' = max(m, max_j s[j])              running maximum (f32)
#   a  = exp(m - m')                     rescaling of the old state
#   p_j = exp(s[j] - m')                 (f32, never rounded to f16)
#   l' = l * a + sum_j p_j               running sum (f32, keys in order)
#   O' = O * a + sum_j p_j V[j, :]       accumulator (f32, fused mac per key)
# The final O / l and the f16 store are device/attention_final.S.
#
# The P V product runs on the f32 vector unit inside this vertex (one
# `f32v2mac` per two head columns per key), not on the AMP: p stays f32
# (one row of it in the vertex's PBUF scratch, as broadcast pairs), never
# rounded to f16. Loop order: per group of four head columns, the O quad
# stays in registers over all keys, so one key costs 4 bundles per four head
# columns (two conversions, two macs; the loads pair with them).
#
# S = Q K^T is produced before this vertex by gemm_f16 with ACC=32 (f32
# scores; docs/kernels.md, "Attention kernels"), or by gemm_f32 for f32
# attention.
#
# VT=32 (with PV=0 only): V is f32 (f32 attention). Each key then costs 3
# bundles per four head columns instead of 4: the p pair and V's two f32
# pairs load in three bundles (one memory access each) and the two macs
# ride in them; no conversions. The first mac of a quad folds in zero
# times the p pair left in $a10:11 by the row's p loop or the previous
# quad (finite: exponentials), as in the f16 loop.
#
# Causal masking (.param CAUSAL=1): key K0 + j is visible to query Q0 + i iff
# K0 + j <= Q0 + i, so row i uses the first nk = clamp(Q0 + i - K0 + 1, 0, BK)
# keys of the block; a row with nk = 0 is left unchanged (its state is not
# touched, so exp(-inf - -inf) never arises). With CAUSAL=0 every row uses
# all BK keys and Q0/K0 are not read.
#
# Vertex state (u32 words, byte offsets):
#    0 S      address of S[0, 0]: raw scores Q K^T of this block, f32,
#             4-aligned (8-aligned with PV=1)
#    4 RS_S   S row stride in bytes (multiple of 4; of 8 with PV=1)
#    8 V      address of V[0, 0]: f16 [BK, 4*DQ] (VT=32: f32), 8-aligned,
#             head columns padded to a multiple of 4 with zeros
#   12 RS_V   V row stride in bytes (multiple of 8, >= 8*DQ; VT=32: 16*DQ)
#   16 O      address of O[0, 0]: f32 [ROWS, 4*DQ], 8-aligned
#   20 RS_O   O row stride in bytes (multiple of 8)
#   24 ML     address of the running state: ROWS pairs (m, l) of f32, 8-aligned
#             (initially m = -inf, l = 0, O = 0)
#   28 ROWS   query rows (>= 1)
#   32 BK     keys in the block (>= 1)
#   36 DQ     groups of four head columns (ceil(D / 4), >= 1)
#   40 SCALE  f32 bits of the score scale (> 0, e.g. 1/sqrt(D))
#   44 Q0     index of query row 0 in the sequence (CAUSAL=1 only)
#   48 K0     index of key 0 of the block in the sequence (CAUSAL=1 only)
#   52 PBUF   scratch, 8-aligned, this vertex's own: with PV=0 8*BK bytes
#             (p_j as f32 pairs (p_j, p_j), rewritten for every row); with
#             PV=1 8 bytes (the pair (-m', -m') that the p loop reloads)
#   56 P      address of P[0, 0], f16 [ROWS, BKP] (PT=32: f32; PV=1 only), 8-aligned: the A operand
#             of gemm_f16 ACC=32 for P V
#   60 RS_P   P row stride in bytes (PV=1 only)
#   64 BKP    keys padded for the GEMM (>= BK; PV=1 only): P[i, nk..BKP] = 0
#   68 ALPHA  address of ROWS f32 rescaling factors a (PV=1 only), for
#             attention_merge: O = O * a + (P V)
#
# PT=32 (with PV=1 only; f32 attention): P is f32 [ROWS, BKP] for gemm_f32,
# each pair of p stored as it is, in the same bundles (no conversion).
#
# PV=1 (P V on the AMP): the vertex updates (m, l), writes p rounded to f16
# into P (masked and padding keys as zeros; a row with no visible key gets
# a zero P row and a = 1) and a into ALPHA, and touches neither O nor V.
# It works on pairs of keys: the row maximum with `f32v2max`, and
# p = exp(s * SCALE - m') with one fused `f32v2mac` onto (-m', -m') (which
# the idle load slot reloads from PBUF each pair), a two-slot `f32v2exp`
# and a pair of running sums, software-pipelined so that the loads and the
# store ride in the same bundles. With f16 P (PT=16) it takes the keys in
# quads, two pairs converted by one `f32v4tof16` and stored by one `st64`:
# 9 issue slots per four keys (10 as pairs until session 56, 5 per pair
# with a `f32v2tof16` each; the first version took 7 slots per key). gemm_f16 ACC=32 then computes P V in f32 (A = P, B = V padded to
# [BKP, 16 * ncb]) and device/attention_merge.S forms O * a + P V.
#
# ONES=1 (with PV=1 and PT=16): the P V GEMM sums p itself. Its V holds a
# column of ones at column 4 * DQ, so P V's column 4 * DQ is sum_j p_j of
# the f16 p it multiplied, and device/attention_merge.S ONES=1 forms
# l' = l a + that sum. This vertex then writes m' and a, leaves l alone
# and needs no running sums, and it takes the exponentials in f16 as
# softmax_cols does: p = f16(exp(f16(s * SCALE - m'))), the argument
# formed in f32 with one fused mac. A quad of keys then takes 5 issue
# slots (a 128-bit load of its four scores, two reloads of (-m', -m'),
# two macs, one `f32v4tof16`, one two-slot `f16v4exp` and one `st64`)
# where the f32 exponentials and the sums took 9. S must then be
# 16-aligned in interleaved memory with RS_S a multiple of 16 (the scores
# GEMM's C buffer is). The sum is of the rounded p that P V uses, so the
# output is a weighted mean of V's rows whatever p's rounding.
#
# ACC=1 (with EXP=16, or PT=32 for f32 attention): P V accumulates into
# O on the AMP (gemm_f16's or gemm_f32's accumulate mode), so this vertex
# keeps O scaled to its running maximum itself and writes no factors
# (ALPHA is not read). The maximum moves only when the block's passes it
# by more than 8 (p stays below e^8, inside f16); a move rescales the
# row's O in place by a = exp(m - m') (O at O, RS_O apart; with ONES=1
# DQ + 1 quads, the last holding l in the ones column) and l (ONES=0),
# except while m is -inf (all zero). f32 P would not overflow with the
# exact maximum, but each move costs a pass over O's row, which the lazy
# maximum makes rare.
#
# With ACC=1 (p first; EXP=16 or PT=32) the vertex does not take the row's
# maximum first: it takes the block's p from m' = m and checks their sum
# after. A sum of at most LAZY_SUM (4096) bounds every p, so m stays and
# the maximum's pass (half a bundle a key, a fifth of the vertex at 128
# keys) is saved; above it, and for the first block (m = -inf), the
# row's maximum decides as above, and a move takes the p again. With
# ONES=0 the sum is the one the vertex keeps for l anyway, so the check
# costs 2 slots a row; with ONES=1 (no sums) the largest p stands in for
# it, an `f16v4max` a quad of keys, and passes 4096 only where m moves.
#
# SCALE must be positive: the row maximum is taken on raw scores and scaled
# once. Each worker runs its own vertex over its own query rows (its own O
# rows and (m, l) pairs); S and V are only read, so workers may share them.

        .kernel attention_online
        .param CAUSAL, 0
        .param PV, 0
        .param VT, 16
        .param PT, 16
        .param ONES, 0
        .param EXP, 32
        .param ACC, 0
        .workers 6
        .if ONES != 0 && ONES != 1
        .error "ONES must be 0 (this vertex sums p into l) or 1 (P V's ones column sums p)"
        .endif
        .if EXP != 16 && EXP != 32
        .error "EXP must be 32 (f32 exponentials) or 16 (f16 exponentials of f16 arguments)"
        .endif
        .if EXP == 16 && (PV != 1 || PT != 16)
        .error "EXP=16 needs PV=1 and PT=16: f16 p for the P V GEMM"
        .endif
        .if ONES == 1 && EXP != 16
        .error "ONES=1 needs EXP=16: the vertex without sums takes f16 exponentials"
        .endif
        .if ACC != 0 && ACC != 1
        .error "ACC must be 0 (attention_merge forms O a + P V) or 1 (P V accumulates into O; a lazy running maximum)"
        .endif
        .if ACC == 1 && EXP != 16 && PT != 32
        .error "ACC=1 needs EXP=16 (f16 P from f16 exponentials, with the vertex's own sums or ONES=1) or PT=32 (f32 P)"
        .endif
        .if CAUSAL != 0 && CAUSAL != 1
        .error "CAUSAL must be 0 (all keys) or 1 (key index <= query index)"
        .endif
        # ACC=1: p first from the lazy maximum, the row's maximum only
        # when their sum (ONES=1: the largest p) passes LAZY_SUM (4096.0,
        # the high 20 bits of its f32) or m is -inf.
        .equ LAZY_SUM, 0x45800
        .if VT != 16 && VT != 32
        .error "VT must be 16 (f16 V) or 32 (f32 V)"
        .endif
        .if VT == 32 && PV != 0
        .error "VT=32 (f32 V) needs PV=0: P V on the vector unit"
        .endif
        .if PT != 16 && PT != 32
        .error "PT must be 16 (f16 P for gemm_f16) or 32 (f32 P for gemm_f32)"
        .endif
        .if PT == 32 && PV != 1
        .error "PT=32 (f32 P) needs PV=1: P V on the AMP"
        .endif
        .if PV == 0 && VT == 32
        .cycles "6 * (8 + ROWS * (26 + 7 * BK + DQ * (13 + 3 * BK)))"
        .elseif PV == 0
        .cycles "6 * (8 + ROWS * (26 + 7 * BK + DQ * (12 + 4 * BK)))"
        .elseif PV == 1 && PT == 32 && ACC == 1
        # As ACC=0 below less the row maximum's pass (a bundle a pair and
        # 7 slots net of the sum's check, 2 more for an odd key), where no
        # row's p sum past LAZY_SUM; see ACC=1 EXP=16 ONES=0 below for the
        # rows that do and for FIRST, which adds the maximum's pass, the
        # lazy test and the move.
        .cycles "6 * (12 + ROWS * (46 + 4 * (BK / 2) + 5 * (BK - 2 * (BK / 2)) - 2 * (1 / (BK / 2 + 1)) + (BKP - BK) + FIRST * (23 + BK / 2 + 2 * (BK - 2 * (BK / 2)))))"
        .elseif PV == 1 && PT == 32
        # Per row: 5 slots a pair of keys (its maximum, then the mac, the
        # two-slot exponential and the sum, the loads and the store riding
        # in the same bundles), 7 for an odd key, 2 fewer without a pair,
        # a store per padding key.
        .cycles "6 * (12 + ROWS * (51 + 5 * (BK / 2) + 7 * (BK - 2 * (BK / 2)) - 2 * (1 / (BK / 2 + 1)) + (BKP - BK)))"
        .elseif PV == 1 && EXP == 16 && ACC == 1 && ONES == 1
        # As ONES=1 below less the row maximum's pass, with a sixth slot a
        # quad for the largest p (f16v4max; the leftover pair's and odd
        # key's ride with their stores), where no row's largest p passes
        # LAZY_SUM (see ACC=1 ONES=0 below for the rows that do). FIRST
        # (not a state word: the compiler's knowledge that every row
        # starts from m = -inf, the rows' first block) adds the maximum's
        # pass and the move.
        .cycles "6 * (12 + ROWS * (46 + 6 * (BK / 4) - 4 * (1 / (BK / 4 + 1)) + 7 * (BK / 2 - 2 * (BK / 4)) + 7 * (BK - 2 * (BK / 2)) + (BKP - BK) + FIRST * (22 + BK / 2 + 2 * (BK - 2 * (BK / 2)))))"
        .elseif PV == 1 && EXP == 16 && ACC == 1
        # As ONES=0 below less the row maximum's pass (BK / 2 bundles, 7
        # slots net of the sum's check, 2 more for an odd key), where no
        # row's p sum past LAZY_SUM: a row whose sum does takes
        # the maximum's pass, and one that moves the maximum also rescales
        # O's row in place (4 bundles a quad and about 12 more) and takes
        # its p again, which no formula of the shapes can know. FIRST (the
        # rows' first block, m = -inf on every row) adds the maximum's
        # pass and the move.
        .cycles "6 * (12 + ROWS * (48 + 7 * (BK / 4) - 4 * (1 / (BK / 4 + 1)) + 9 * (BK / 2 - 2 * (BK / 4)) + 8 * (BK - 2 * (BK / 2)) + (BKP - BK) + FIRST * (23 + BK / 2 + 2 * (BK - 2 * (BK / 2)))))"
        .elseif PV == 1 && EXP == 16 && ONES == 0
        # As ONES=1 below, with 7 slots a quad (its f16v4hsum and the f32
        # add), two more for a leftover pair, one more for an odd key, and
        # six a row for l a and l'.
        .cycles "6 * (12 + ROWS * (53 + BK / 2 + 7 * (BK / 4) - 4 * (1 / (BK / 4 + 1)) + 9 * (BK / 2 - 2 * (BK / 4)) + 10 * (BK - 2 * (BK / 2)) + (BKP - BK)))"
        .elseif PV == 1 && ONES == 1
        # Per row: the maximum's pairs, 5 slots a quad and 5 for the quad
        # loop's prologue and drain, 7 for a leftover pair, 9 for an odd
        # key (its maximum too), a store per padding key.
        .cycles "6 * (12 + ROWS * (48 + BK / 2 + 5 * (BK / 4) - 5 * (1 / (BK / 4 + 1)) + 7 * (BK / 2 - 2 * (BK / 4)) + 9 * (BK - 2 * (BK / 2)) + (BKP - BK)))"
        .elseif PV == 1
        # Per row: the pairs' slots, less one per quad of keys, plus two
        # for the saved state, two for a leftover pair after quads (-1
        # without quads).
        .cycles "6 * (12 + ROWS * (56 + 3 * BK - BK / 4 + 2 * (BK / 2 - 2 * (BK / 4)) - 3 * ((BK / 2 - 2 * (BK / 4)) / (BK / 4 + 1)) + (BKP - BK)))"
        .else
        .error "PV must be 0 (P V on the vector unit) or 1 (P to f16 for gemm_f16)"
        .endif

        .equ ST_S, 0
        .equ ST_RS_S, 4
        .equ ST_V, 8
        .equ ST_RS_V, 12
        .equ ST_O, 16
        .equ ST_RS_O, 20
        .equ ST_ML, 24
        .equ ST_ROWS, 28
        .equ ST_BK, 32
        .equ ST_DQ, 36
        .equ ST_SCALE, 40
        .equ ST_Q0, 44
        .equ ST_K0, 48
        .equ ST_PBUF, 52
        .equ ST_P, 56
        .equ ST_RS_P, 60
        .equ ST_BKP, 64
        .equ ST_ALPHA, 68

# Integer registers: $m0 state (BK, SCALE, V, PBUF and the strides are
# re-read per row or quad), $m1 Q0 - K0 + 1 + i (CAUSAL), $m2 S row, $m3 O
# row, $m4 rows left - 1, $m5 temporary, $m6 DQ, $m7 (m, l) walk, $m8 RS_V,
# $m9 V column of the quad, $m10 quads left - 1, $m11 visible keys, $m12 S
# or V walk, $m13 PBUF walk, $m14 O walk.
# Float registers: $a12 SCALE, $a13 m', $a14 l', $a15 a (then $a12:13 the
# pair (a, a)), $a10:11 p pair, $a0..$a9 temporaries.

        .text
        .globl attention_online
        .entry attention_online
attention_online:
        ld32 $m2, [$m0 + ST_S]
        ld32 $m3, [$m0 + ST_O]
        ld32 $m7, [$m0 + ST_ML]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m6, [$m0 + ST_DQ]
        ld32 $m8, [$m0 + ST_RS_V]
        .if PV
        ld32 $m9, [$m0 + ST_P]
        ld32 $m14, [$m0 + ST_ALPHA]
        ld32 $m10, [$m0 + ST_PBUF]
        .endif
        .if CAUSAL
        ld32 $m1, [$m0 + ST_Q0]
        ld32 $m11, [$m0 + ST_K0]
        sub $m1, $m1, $m11
        add $m1, $m1, 1
        .endif
row:
        ld32 $m11, [$m0 + ST_BK]
        .if CAUSAL
        max $m5, $m1, $mzero
        min $m11, $m11, $m5
        add $m1, $m1, 1
        brz $m11, skip_row
        .endif
        ld32 $a12, [$m0 + ST_SCALE]
        .if ACC
        # ACC=1: the block's p first from m' = m, the row's sum of them
        # (ONES=1: the largest) checked after (exp16_tail_done, tail_done).
        # While m is -inf, or when the check fails, the row's maximum
        # decides as below ($m14 = 1: checked), and a move takes the p
        # again.
        setzi $m14, 0
        ld64 $a4:5, [$m7]
        mov $a13, $a4
        mov $a14, $a5
        sethi $a15, 0xFF800
        f32cmpeq $a15, $a4, $a15
        mov $m5, $a15
        brz $m5, exps
lazy_max:
        setzi $m14, 1
        ld32 $a12, [$m0 + ST_SCALE]
        .endif

        # Row maximum of the visible raw scores; each bundle folds in the
        # score (PV=1: the pair of scores) loaded by the previous one.
        mov $m13, $m2
        .if PV
        sethi $a0, 0xFF800
        sethi $a1, 0xFF800
        sethi $a2, 0xFF800
        sethi $a3, 0xFF800
        shr $m5, $m11, 1
        rpt $m5, 1
        { ld64 $a0:1, [$m13]+=8 ; f32v2max $a2:3, $a2:3, $a0:1 }
        f32v2max $a2:3, $a2:3, $a0:1
        f32v2hmax $a3, $a2:3
        and $m5, $m11, 1
        brz $m5, max_done
        ld32 $a0, [$m13]
        f32max $a3, $a3, $a0
max_done:
        .else
        sethi $a0, 0xFF800
        sethi $a3, 0xFF800
        rpt $m11, 1
        { ld32 $a0, [$m13]+=4 ; f32max $a3, $a3, $a0 }
        f32max $a3, $a3, $a0
        .endif
        f32mul $a3, $a3, $a12

        # m' = max(m, rowmax), a = exp(m - m'), l * a.
        ld64 $a4:5, [$m7]
        .if ACC
        # ACC=1: m' = m unless the row's maximum passes m by more than 8
        # (p <= e^8 then, well inside f16); a move rescales O's row and l
        # in place by a = exp(m - m'), except while m is still -inf (O and
        # l are zero then). Registers: $a13 m', $a14 l', $a0:1 (a, a).
        mov $a13, $a4
        mov $a14, $a5
        sethi $a6, 0x41000
        f32add $a6, $a4, $a6
        f32cmplt $a6, $a6, $a3
        mov $m5, $a6
        # Kept (only after the sum's check: from -inf it always moves),
        # so the block's p and their sum ($a15) stand.
        brz $m5, lazy_kept
        mov $a13, $a3
        sethi $a15, 0xFF800
        f32cmpeq $a15, $a4, $a15
        mov $m5, $a15
        brnz $m5, acc_kept
        f32sub $a15, $a4, $a3
        f32exp $a15, $a15
        f32mul $a14, $a5, $a15
        f32v2bcast $a0:1, $a15
        mov $m12, $m3
        .if ONES
        # With ONES=1 l lives in O's ones column (column 4 DQ, P V's sum
        # of p), which the quad after the DQ quads holds: it scales too.
        add $m5, $m6, 1
        rpt $m5, 4
        .else
        rpt $m6, 4
        .endif
        ld64 $a4:5, [$m12 + 0]
        { ld64 $a6:7, [$m12 + 8] ; f32v2mul $a4:5, $a4:5, $a0:1 }
        { st64 $a4:5, [$m12]+=8 ; f32v2mul $a6:7, $a6:7, $a0:1 }
        st64 $a6:7, [$m12]+=8
acc_kept:
        .else
        f32max $a13, $a4, $a3
        f32sub $a15, $a4, $a13
        f32exp $a15, $a15
        .if ONES == 0
        f32mul $a14, $a5, $a15
        .endif
        .endif

        .if PV && EXP == 16
exps:
        # p_j = f16(exp(f16(s_j * SCALE - m'))) for the visible keys into
        # the P row, then zeros up to BKP; m' to the state slot, a to
        # ALPHA, l left to attention_merge ONES=1 (with ONES=0, l * a
        # waits in the state slot and each quad's f16v4hsum joins an f32
        # running sum: 7 issue slots a quad). Registers: $a8:9
        # (SCALE, SCALE), $a0:1 and $a2:3 (-m', -m') then a quad's
        # arguments, $a4:7 its scores, $a10:11 the arguments in f16,
        # $a12:13 the quad of p, $a14 its sum, $a15 the row's sum.
        f32neg $a2, $a13
        { st32 $a13, [$m7] ; f32v2bcast $a2:3, $a2 }
        { st64 $a2:3, [$m10] ; f32v2bcast $a8:9, $a12 }
        .if ONES == 0
        st32 $a14, [$m7 + 4]
        .endif
        .if ACC == 0
        st32 $a15, [$m14]+=4
        .endif
        .if ONES == 0
        setzi $a15, 0
        .elseif ACC
        # ONES=1 keeps no sum: the largest p (f16 lanes) stands in for it.
        setzi $a14, 0
        setzi $a15, 0
        .endif
        mov $m12, $m2
        mov $m13, $m9
        shr $m5, $m11, 2
        brz $m5, exp16_quads_done
        # Quad 0's loads and macs; then per further quad i its loads and
        # macs while quad i - 1 is converted, exponentiated and stored
        # (each bundle reads before it writes).
        ld64 $a0:1, [$m10]
        ld128 $a4:7, [$m12]+=16
        { ld64 $a2:3, [$m10] ; f32v2mac $a0:1, $a4:5, $a8:9 }
        f32v2mac $a2:3, $a6:7, $a8:9
        add $m5, $m5, -1
        .if ONES && ACC
        rpt $m5, 5
        .elseif ONES
        rpt $m5, 4
        .else
        rpt $m5, 6
        .endif
        { ld64 $a0:1, [$m10] ; f32v4tof16 $a10:11, $a0:3 }
        { ld128 $a4:7, [$m12]+=16 ; f16v4exp $a12:13, $a10:11 }
        { ld64 $a2:3, [$m10] ; f32v2mac $a0:1, $a4:5, $a8:9 }
        { st64 $a12:13, [$m13]+=8 ; f32v2mac $a2:3, $a6:7, $a8:9 }
        .if ONES && ACC
        f16v4max $a14:15, $a14:15, $a12:13
        .endif
        .if ONES == 0
        f16v4hsum $a14, $a12:13
        f32add $a15, $a15, $a14
        .endif
        f32v4tof16 $a10:11, $a0:3
        f16v4exp $a12:13, $a10:11
        .if ONES && ACC
        { st64 $a12:13, [$m13]+=8 ; f16v4max $a14:15, $a14:15, $a12:13 }
        .elseif ONES
        st64 $a12:13, [$m13]+=8
        .else
        { st64 $a12:13, [$m13]+=8 ; f16v4hsum $a14, $a12:13 }
        f32add $a15, $a15, $a14
        .endif
exp16_quads_done:
        # A last pair, then an odd key (the unused f16 lanes are zeros).
        and $m5, $m11, 2
        brz $m5, exp16_pair_done
        ld64 $a0:1, [$m10]
        ld64 $a4:5, [$m12]+=8
        { setzi $a11, 0 ; f32v2mac $a0:1, $a4:5, $a8:9 }
        f32v2tof16 $a10, $a0:1
        f16v4exp $a12:13, $a10:11
        .if ONES && ACC
        # The lanes past the pair hold exp(0) = 1, below any bound.
        { st32 $a12, [$m13]+=4 ; f16v4max $a14:15, $a14:15, $a12:13 }
        .elseif ONES
        st32 $a12, [$m13]+=4
        .else
        { st32 $a12, [$m13]+=4 ; f16v2tof32 $a0:1, $a12 }
        f32v2hsum $a14, $a0:1
        f32add $a15, $a15, $a14
        .endif
exp16_pair_done:
        and $m5, $m11, 1
        brz $m5, exp16_tail_done
        ld32 $a0, [$m10]
        ld32 $a4, [$m12]+=4
        { setzi $a1, 0 ; f32mac $a0, $a4, $a8 }
        { setzi $a11, 0 ; f32v2tof16 $a10, $a0:1 }
        f16v4exp $a12:13, $a10:11
        .if ONES && ACC
        { st16 $a12, [$m13]+=2 ; f16v4max $a14:15, $a14:15, $a12:13 }
        .elseif ONES
        st16 $a12, [$m13]+=2
        .else
        { st16 $a12, [$m13]+=2 ; f16v2tof32 $a0:1, $a12 }
        f32add $a15, $a15, $a0
        .endif
exp16_tail_done:
        .if ACC
        # The sum (ONES=1: the largest p) at most LAZY_SUM bounds every
        # p: m stays. Above it the row's maximum decides (lazy_max),
        # unless it has already.
        brnz $m14, lazy_tail
        .if ONES
        f16v4hmax $a15, $a14:15
        .endif
        sethi $a14, LAZY_SUM
        f32cmplt $a14, $a14, $a15
        mov $m5, $a14
        brnz $m5, lazy_max
lazy_tail:
        .endif
        ld32 $m5, [$m0 + ST_BKP]
        sub $m5, $m5, $m11
        setzi $a9, 0
        rpt $m5, 1
        st16 $a9, [$m13]+=2
        .if ONES == 0
        # l' = l a + the row's sum.
        ld32 $a14, [$m7 + 4]
        f32add $a14, $a14, $a15
        st32 $a14, [$m7 + 4]
        .endif
        add $m7, $m7, 8
        br next_row
        .elseif PV
exps:
        # p_j = exp(s_j * SCALE - m') for the visible keys, each rounded to
        # f16 into the P row (PT=32: stored as it is) and added to the pair
        # of running sums $a6:7 (lane 0 the even keys, lane 1 the odd ones,
        # in key order); then zeros up to BKP.
        # Registers: $a8:9 (SCALE, SCALE), $a6:7 the sums.
        f32neg $a2, $a13
        .if PT == 32
        f32v2bcast $a2:3, $a2
        st64 $a2:3, [$m10]
        f32v2bcast $a8:9, $a12
        .else
        # The quads of keys below need $a12..$a15 for four exponentials:
        # m' and l * a wait in the row's state slot (l' replaces l * a
        # after the keys) and a goes to ALPHA now.
        { st32 $a13, [$m7] ; f32v2bcast $a2:3, $a2 }
        { st64 $a2:3, [$m10] ; f32v2bcast $a8:9, $a12 }
        st32 $a14, [$m7 + 4]
        st32 $a15, [$m14]+=4
        .endif
        setzi $a6, 0
        setzi $a7, 0
        mov $m12, $m2
        mov $m13, $m9
        .if PT == 32
        # Pairs of keys. Registers: $a2:3 (-m', -m') then the argument,
        # $a0:1 the scores, $a10:11 the pair of p.
        shr $m5, $m11, 1
        brz $m5, pairs_done
        # Pair 0's argument, then per further pair i: pair i - 1's
        # exponential (beside the reload of (-m', -m'), which the bundle
        # reads before it writes), its sum and store beside pair i's load
        # and argument; 4 issue slots a pair, every memory access riding
        # with arithmetic (f32 P: stored as it is, no conversion).
        ld64 $a0:1, [$m12]+=8
        { add $m5, $m5, -1 ; f32v2mac $a2:3, $a0:1, $a8:9 }
        rpt $m5, 3
        { ld64 $a2:3, [$m10] ; f32v2exp $a10:11, $a2:3 }
        { ld64 $a0:1, [$m12]+=8 ; f32v2add $a6:7, $a6:7, $a10:11 }
        { st64 $a10:11, [$m13]+=8 ; f32v2mac $a2:3, $a0:1, $a8:9 }
        f32v2exp $a10:11, $a2:3
        { st64 $a10:11, [$m13]+=8 ; f32v2add $a6:7, $a6:7, $a10:11 }
        .else
        # Quads of keys, as two pairs A and B: 9 issue slots a quad (two
        # fused macs, two two-slot exponentials, two sums and one
        # `f32v4tof16`; the loads and the store ride in the same bundles),
        # where a pair alone takes 5. Quad 0's arguments and exponentials
        # first; then per further quad i its arguments and exponentials
        # while quad i - 1 is converted, stored and summed. Registers:
        # $a0:1 and $a2:3 pair A's and B's (-m', -m') then arguments ($a2:3
        # also quad i - 1's four f16 until stored), $a4:5 and $a10:11 their
        # scores, $a12:15 the quad of p (A in $a12:13, B in $a14:15).
        shr $m5, $m11, 2
        brz $m5, quads_done
        ld64 $a0:1, [$m10]
        ld64 $a4:5, [$m12]+=8
        { ld64 $a2:3, [$m10] ; f32v2mac $a0:1, $a4:5, $a8:9 }
        { ld64 $a10:11, [$m12]+=8 ; f32v2exp $a12:13, $a0:1 }
        f32v2mac $a2:3, $a10:11, $a8:9
        { add $m5, $m5, -1 ; f32v2exp $a14:15, $a2:3 }
        rpt $m5, 7
        { ld64 $a0:1, [$m10] ; f32v4tof16 $a2:3, $a12:15 }
        { ld64 $a4:5, [$m12]+=8 ; f32v2add $a6:7, $a6:7, $a12:13 }
        { st64 $a2:3, [$m13]+=8 ; f32v2mac $a0:1, $a4:5, $a8:9 }
        { ld64 $a2:3, [$m10] ; f32v2exp $a12:13, $a0:1 }
        { ld64 $a10:11, [$m12]+=8 ; f32v2add $a6:7, $a6:7, $a14:15 }
        f32v2mac $a2:3, $a10:11, $a8:9
        f32v2exp $a14:15, $a2:3
        f32v4tof16 $a2:3, $a12:15
        { st64 $a2:3, [$m13]+=8 ; f32v2add $a6:7, $a6:7, $a12:13 }
        f32v2add $a6:7, $a6:7, $a14:15
quads_done:
        # A last pair of keys.
        and $m5, $m11, 2
        brz $m5, pair_done
        ld64 $a2:3, [$m10]
        ld64 $a0:1, [$m12]+=8
        f32v2mac $a2:3, $a0:1, $a8:9
        f32v2exp $a10:11, $a2:3
        f32v2tof16 $a4, $a10:11
        { st32 $a4, [$m13]+=4 ; f32v2add $a6:7, $a6:7, $a10:11 }
pair_done:
        ld32 $a14, [$m7 + 4]
        .endif
pairs_done:
        .if ACC
        # The row's sum apart from l until it is checked.
        f32v2hsum $a15, $a6:7
        .else
        f32v2hsum $a0, $a6:7
        f32add $a14, $a14, $a0
        .endif
        and $m5, $m11, 1
        brz $m5, tail_done
        ld32 $a2, [$m10]
        ld32 $a0, [$m12]+=4
        f32mac $a2, $a0, $a8
        f32exp $a0, $a2
        .if ACC
        { st32 $a0, [$m13]+=4 ; f32add $a15, $a15, $a0 }
        .elseif PT == 32
        { st32 $a0, [$m13]+=4 ; f32add $a14, $a14, $a0 }
        .else
        f32v2tof16 $a1, $a0:1
        { st16 $a1, [$m13]+=2 ; f32add $a14, $a14, $a0 }
        .endif
tail_done:
        .if ACC
        # As exp16_tail_done: the sum at most LAZY_SUM keeps m.
        brnz $m14, lazy_tail
        sethi $a0, LAZY_SUM
        f32cmplt $a0, $a0, $a15
        mov $m5, $a0
        brnz $m5, lazy_max
lazy_tail:
        f32add $a14, $a14, $a15
        .endif
        ld32 $m5, [$m0 + ST_BKP]
        sub $m5, $m5, $m11
        setzi $a9, 0
        .if PT == 32
        rpt $m5, 1
        st32 $a9, [$m13]+=4
        .else
        rpt $m5, 1
        st16 $a9, [$m13]+=2
        .endif
        .if PT == 32
        mov $a0, $a13
        mov $a1, $a14
        st64 $a0:1, [$m7]+=8
        .if ACC == 0
        st32 $a15, [$m14]+=4
        .endif
        .else
        st32 $a14, [$m7 + 4]
        add $m7, $m7, 8
        .endif
        br next_row
        .endif
        .if ACC
        # Reached only by branch (both PV sections above end in a branch;
        # PV=0 never has ACC=1). The maximum's pass walked $m13 over S: back
        # to the P row's padding, after its BK p of PT / 8 bytes each.
lazy_kept:
        shl $m5, $m11, PT / 16
        add $m13, $m9, $m5
        br lazy_tail
        .endif

        # p_j = exp(s_j - m') for the visible keys, l' += p_j in key order,
        # and each p_j stored as an f32 pair (p, p) in the worker's PBUF.
        mov $m12, $m2
        ld32 $m13, [$m0 + ST_PBUF]
        rpt $m11, 6
        ld32 $a0, [$m12]+=4
        f32mul $a0, $a0, $a12
        f32sub $a0, $a0, $a13
        f32exp $a0, $a0
        { nop ; f32v2bcast $a10:11, $a0 }
        { st64 $a10:11, [$m13]+=8 ; f32add $a14, $a14, $a0 }

        # Store (m', l'); $a12:13 becomes the pair (a, a).
        mov $a0, $a13
        mov $a1, $a14
        { st64 $a0:1, [$m7]+=8 ; f32v2bcast $a12:13, $a15 }

        # Per group of four head columns: the O quad stays in $a2:3/$a6:7,
        # is scaled by a, and takes p_j V[j, quad] for every visible key,
        # V walked down its column with the register stride RS_V. The hi
        # half's mac of key j runs in the first bundle of key j + 1 (and
        # once after the loop); $a8:9 = 0 makes the first one add zero.
        ld32 $m9, [$m0 + ST_V]
        mov $m14, $m3
        add $m10, $m6, -1
        .if VT == 32
        # f32 V: $m12 walks the quad's low pair down the column, $m5 its
        # high pair; per key the p pair, the low and the high V pair load
        # in three bundles and the high mac of key j runs in the first
        # bundle of key j + 1 (reads before writes: it sees p_j while the
        # bundle loads p_(j+1)).
quad32:
        mov $m12, $m9
        add $m5, $m9, 8
        ld32 $m13, [$m0 + ST_PBUF]
        ld64 $a2:3, [$m14 + 0]
        { ld64 $a6:7, [$m14 + 8] ; f32v2mul $a2:3, $a2:3, $a12:13 }
        { setzi $a4, 0 ; f32v2mul $a6:7, $a6:7, $a12:13 }
        setzi $a5, 0
        rpt $m11, 3
        { ld64 $a10:11, [$m13]+=8 ; f32v2mac $a6:7, $a4:5, $a10:11 }
        ld64 $a0:1, [$m12]+=$m8
        { ld64 $a4:5, [$m5]+=$m8 ; f32v2mac $a2:3, $a0:1, $a10:11 }
        f32v2mac $a6:7, $a4:5, $a10:11
        st64 $a2:3, [$m14]+=8
        { st64 $a6:7, [$m14]+=8 ; nop }
        add $m9, $m9, 16
        brnzdec $m10, quad32
        br next_row
        .endif
quad:
        mov $m12, $m9
        ld32 $m13, [$m0 + ST_PBUF]
        ld64 $a2:3, [$m14 + 0]
        { ld64 $a6:7, [$m14 + 8] ; f32v2mul $a2:3, $a2:3, $a12:13 }
        { setzi $a8, 0 ; f32v2mul $a6:7, $a6:7, $a12:13 }
        setzi $a9, 0
        rpt $m11, 4
        { ld64 $a0:1, [$m12]+=$m8 ; f32v2mac $a6:7, $a8:9, $a10:11 }
        { ld64 $a10:11, [$m13]+=8 ; f16v2tof32 $a4:5, $a0 }
        f16v2tof32 $a8:9, $a1
        f32v2mac $a2:3, $a4:5, $a10:11
        f32v2mac $a6:7, $a8:9, $a10:11
        st64 $a2:3, [$m14]+=8
        { st64 $a6:7, [$m14]+=8 ; nop }
        add $m9, $m9, 8
        brnzdec $m10, quad
        br next_row
skip_row:
        add $m7, $m7, 8
        .if PV
        # No visible key: a zero P row and a = 1 leave O, m and l unchanged.
        mov $m13, $m9
        ld32 $m5, [$m0 + ST_BKP]
        setzi $a9, 0
        .if PT == 32
        rpt $m5, 1
        st32 $a9, [$m13]+=4
        .else
        rpt $m5, 1
        st16 $a9, [$m13]+=2
        .endif
        .if ACC == 0
        sethi $a15, 0x3F800
        st32 $a15, [$m14]+=4
        .endif
        .endif
next_row:
        .if PV
        ld32 $m5, [$m0 + ST_RS_P]
        add $m9, $m9, $m5
        .endif
        ld32 $m5, [$m0 + ST_RS_S]
        add $m2, $m2, $m5
        ld32 $m5, [$m0 + ST_RS_O]
        add $m3, $m3, $m5
        brnzdec $m4, row
        exit
