# Flash attention over key ranges split between tiles: this vertex folds
# the state of another key range (O2, (m2, l2), received by exchange) into
# this tile's state (O, (m, l)) for ROWS query rows:
#   m' = max(m, m2), a = exp(m - m'), b = exp(m2 - m'),
#   l' = l a + l2 b (one fused rounding), O' = O a + O2 b (f32v2mul, then
#   one fused f32v2mac), and (m', l') replaces (m, l).
# The range of this tile holds key 0, so m is finite for every row (causal
# rows see key 0); a row that saw no key of the other range has m2 = -inf,
# l2 = 0 and O2 = 0, so b = 0 leaves it unchanged.
#
# Vertex state (u32 words, byte offsets):
#    0 O      address of O[0, 0] (f32 [ROWS, 4*DQ], 8-aligned), updated
#    4 RS_O   O row stride in bytes (multiple of 8)
#    8 ML     address of ROWS (m, l) f32 pairs (8-aligned), updated
#   12 O2     address of the other range's O (8-aligned)
#   16 RS_O2  its row stride (multiple of 8)
#   20 ML2    address of its ROWS (m, l) pairs (8-aligned)
#   24 ROWS   rows (>= 1)
#   28 DQ     groups of four head columns (>= 1)
#
# Each worker runs its own vertex over its own rows.

        .kernel attention_combine
        .workers 6
        .cycles "6 * (10 + ROWS * (21 + 8 * DQ))"

        .equ ST_O, 0
        .equ ST_RS_O, 4
        .equ ST_ML, 8
        .equ ST_O2, 12
        .equ ST_RS_O2, 16
        .equ ST_ML2, 20
        .equ ST_ROWS, 24
        .equ ST_DQ, 28

# $m2 O row, $m3 O2 row, $m4 rows left - 1, $m5 pairs per row (2 DQ), $m6
# ML walk, $m7 ML2 walk, $m8 RS_O, $m9 RS_O2, $m12 O load walk, $m13 O2
# walk, $m14 O store walk; $a8:9 the pair (a, a), $a10:11 the pair (b, b).
        .text
        .globl attention_combine
        .entry attention_combine
attention_combine:
        ld32 $m2, [$m0 + ST_O]
        ld32 $m8, [$m0 + ST_RS_O]
        ld32 $m6, [$m0 + ST_ML]
        ld32 $m3, [$m0 + ST_O2]
        ld32 $m9, [$m0 + ST_RS_O2]
        ld32 $m7, [$m0 + ST_ML2]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m5, [$m0 + ST_DQ]
        add $m5, $m5, $m5
row:
        ld64 $a0:1, [$m6]
        ld64 $a2:3, [$m7]+=8
        f32max $a4, $a0, $a2
        f32sub $a5, $a0, $a4
        f32exp $a5, $a5
        f32sub $a6, $a2, $a4
        f32exp $a6, $a6
        f32mul $a7, $a1, $a5
        f32mac $a7, $a3, $a6
        mov $a0, $a4
        mov $a1, $a7
        { st64 $a0:1, [$m6]+=8 ; f32v2bcast $a8:9, $a5 }
        f32v2bcast $a10:11, $a6
        mov $m12, $m2
        mov $m13, $m3
        mov $m14, $m2
        rpt $m5, 4
        ld64 $a0:1, [$m12]+=8
        { ld64 $a2:3, [$m13]+=8 ; f32v2mul $a0:1, $a0:1, $a8:9 }
        f32v2mac $a0:1, $a2:3, $a10:11
        st64 $a0:1, [$m14]+=8
        add $m2, $m2, $m8
        add $m3, $m3, $m9
        brnzdec $m4, row
        exit
