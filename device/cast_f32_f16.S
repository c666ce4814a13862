# f32 -> f16 conversion worker vertex (round to nearest even): the last step
# of a GEMM that accumulates in f32 (gemm_f16 ACC=32) but stores f16.
#
# Vertex state (u32 words, byte offsets):
#    0 SRC     address of the first f32 of row 0 (region 1, 16-aligned)
#    4 RS_SRC  source row stride in bytes (multiple of 16)
#    8 DST     address of the first f16 of row 0 (8-aligned)
#   12 RS_DST  destination row stride in bytes (multiple of 8)
#   16 ROWS    rows (>= 1)
#   20 QUADS   groups of 4 elements per row (>= 1)
#
# Each group of four takes two bundles: `ld128` of four f32 with one
# conversion, then `st64` of the previous four f16 with the other.

        .kernel cast_f32_f16
        .workers 6
        .cycles "6 * (4 + ROWS * (2 * QUADS + 8))"

        .equ ST_SRC, 0
        .equ ST_RS_SRC, 4
        .equ ST_DST, 8
        .equ ST_RS_DST, 12
        .equ ST_ROWS, 16
        .equ ST_QUADS, 20

# $m2 source walk, $m3 destination walk, $m4 rows left, $m5 QUADS - 1,
# $m6/$m7 row starts, $m8/$m9 strides.
        .text
        .globl cast_f32_f16
        .entry cast_f32_f16
cast_f32_f16:
        ld32 $m6, [$m0 + ST_SRC]
        ld32 $m7, [$m0 + ST_DST]
        ld32 $m8, [$m0 + ST_RS_SRC]
        ld32 $m9, [$m0 + ST_RS_DST]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m5, [$m0 + ST_QUADS]
        add $m5, $m5, -1
row:
        mov $m2, $m6
        mov $m3, $m7
        ld128 $a0:3, [$m2]+=16
        f32v2tof16 $a4, $a0:1
        rpt $m5, 2
        { ld128 $a0:3, [$m2]+=16 ; f32v2tof16 $a5, $a2:3 }
        { st64 $a4:5, [$m3]+=8 ; f32v2tof16 $a4, $a0:1 }
        f32v2tof16 $a5, $a2:3
        st64 $a4:5, [$m3]+=8
        add $m6, $m6, $m8
        add $m7, $m7, $m9
        brnzdec $m4, row
        exit
