# Sum of P f32 partial matrices, stored as f16 (OUT=16, round to nearest
# even) or f32 (OUT=32): the last step of a GEMM whose K blocks were split
# over workers (each worker accumulates its own f32 partial) or, with P = 1,
# the f32 -> f16 conversion of an f32-accumulated GEMM with an f16 result.
#
# Vertex state (u32 words, byte offsets):
#    0 SRC      address of row 0, column 0 of partial 0 (region 1, 16-aligned)
#    4 SECTION  bytes from one partial to the next (multiple of 16)
#    8 P        partials (>= 1)
#   12 RS_SRC   partial row stride in bytes (multiple of 16)
#   16 DST      address of row 0 of the result (8-aligned)
#   20 RS_DST   result row stride in bytes (multiple of 8)
#   24 ROWS     rows (>= 1)
#   28 QUADS    groups of 4 elements per row (>= 1)
#
# Sums run in f32 in partial order (p = 0, 1, ...), one rounding per add,
# then one conversion: each group of four costs about 2P + 7 bundles.

        .kernel reduce_f32
        .param OUT, 16
        .workers 6
        .if OUT == 16
        .cycles "6 * (8 + ROWS * (3 + QUADS * (2 * P + 7)))"
        .elseif OUT == 32
        .cycles "6 * (8 + ROWS * (3 + QUADS * (2 * P + 7)))"
        .else
        .error "OUT must be 16 (f16 result) or 32 (f32 result)"
        .endif

        .equ ST_SRC, 0
        .equ ST_SECTION, 4
        .equ ST_P, 8
        .equ ST_RS_SRC, 12
        .equ ST_DST, 16
        .equ ST_RS_DST, 20
        .equ ST_ROWS, 24
        .equ ST_QUADS, 28

# $m2 partial walk, $m3 result walk, $m4 rows left, $m5 quads left in the
# row, $m6 source row start, $m7 result row start, $m8 SECTION, $m9 P - 1,
# $m10 QUADS - 1, $m11 RS_SRC, $m12 RS_DST, $m13 quad source. $a14:15 stay
# zero (workers start with zeroed registers) and clear $a2:3 between groups.
        .text
        .globl reduce_f32
        .entry reduce_f32
reduce_f32:
        ld32 $m6, [$m0 + ST_SRC]
        ld32 $m8, [$m0 + ST_SECTION]
        ld32 $m9, [$m0 + ST_P]
        add $m9, $m9, -1
        ld32 $m11, [$m0 + ST_RS_SRC]
        ld32 $m7, [$m0 + ST_DST]
        ld32 $m12, [$m0 + ST_RS_DST]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m10, [$m0 + ST_QUADS]
        add $m10, $m10, -1
row:
        mov $m13, $m6
        mov $m3, $m7
        mov $m5, $m10
quad:
        mov $m2, $m13
        ld128 $a4:7, [$m2]+=$m8
        # Partials 1..P-1: load the next while adding the previous one's halves.
        rpt $m9, 2
        { ld128 $a0:3, [$m2]+=$m8 ; f32v2add $a6:7, $a6:7, $a2:3 }
        f32v2add $a4:5, $a4:5, $a0:1
        f32v2add $a6:7, $a6:7, $a2:3
        .if OUT == 16
        { add $m13, $m13, 16 ; f32v2tof16 $a8, $a4:5 }
        { nop ; f32v2tof16 $a9, $a6:7 }
        { st64 $a8:9, [$m3]+=8 ; mov64 $a2:3, $a14:15 }
        .else
        { st64 $a4:5, [$m3]+=8 ; mov64 $a2:3, $a14:15 }
        { st64 $a6:7, [$m3]+=8 ; nop }
        add $m13, $m13, 16
        .endif
        brnzdec $m5, quad
        add $m6, $m6, $m11
        add $m7, $m7, $m12
        brnzdec $m4, row
        exit
