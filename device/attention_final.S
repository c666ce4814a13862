# Final normalisation of flash attention: out[i, :] = f16(O[i, :] * recip(l[i]))
# with O the f32 accumulator and l the running sum left by
# device/attention_online.S after the last K/V block (f32 reciprocal, f32
# product, one rounding to f16, nearest even). OUT=32 (f32 attention)
# stores the f32 products, four bundles per group of four columns.
#
# Vertex state (u32 words, byte offsets):
#    0 O      address of O[0, 0] (f32 [ROWS, 4*DQ], 8-aligned)
#    4 RS_O   O row stride in bytes (multiple of 8)
#    8 ML     address of the (m, l) f32 pairs (8-aligned); only l is read
#   12 OUT    address of out[0, 0] (f16, or f32 with OUT=32; 8-aligned); may
#             alias O's rows
#             (each group of four is read before it is written)
#   16 RS_OUT output row stride in bytes (multiple of 8)
#   20 ROWS   rows (>= 1)
#   24 DQ     groups of four head columns (>= 1); all 4*DQ columns are
#             written, the padding ones as (zero) padding
#
# ONES=1: l is O[i, 4*DQ], the ones column that P V accumulated into O
# (attention_online ACC=1 ONES=1, which keeps no l in the state); ML is
# not read.
#
# A row whose l is 0 (every key masked) gives inf/NaN: the compiler never
# issues such a row (with causal masking the first block always holds key 0).

        .kernel attention_final
        .param OUT, 16
        .param ONES, 0
        .workers 6
        .if ONES != 0 && ONES != 1
        .error "ONES must be 0 (l in the (m, l) pairs) or 1 (l in O's column 4 DQ)"
        .endif
        .if OUT == 16 && ONES == 0
        .cycles "6 * (10 + ROWS * (10 + 6 * DQ))"
        .elseif OUT == 32 && ONES == 0
        .cycles "6 * (10 + ROWS * (10 + 4 * DQ))"
        .elseif OUT == 16
        # ONES=1: the ones column's offset once, and a row's l by an add
        # and a load where the pair's load was.
        .cycles "6 * (11 + ROWS * (11 + 6 * DQ))"
        .elseif OUT == 32
        .cycles "6 * (11 + ROWS * (11 + 4 * DQ))"
        .else
        .error "OUT must be 16 (f16 result) or 32 (f32 result)"
        .endif

        .equ ST_O, 0
        .equ ST_RS_O, 4
        .equ ST_ML, 8
        .equ ST_OUT, 12
        .equ ST_RS_OUT, 16
        .equ ST_ROWS, 20
        .equ ST_DQ, 24

# $m2 O row, $m3 out row, $m4 rows left - 1, $m5 DQ, $m6 (m, l) walk, $m7
# RS_O, $m8 RS_OUT, $m12 O walk, $m13 out walk; $a6:7 recip(l) pair.
        .text
        .globl attention_final
        .entry attention_final
attention_final:
        ld32 $m2, [$m0 + ST_O]
        ld32 $m7, [$m0 + ST_RS_O]
        ld32 $m6, [$m0 + ST_ML]
        ld32 $m3, [$m0 + ST_OUT]
        ld32 $m8, [$m0 + ST_RS_OUT]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m5, [$m0 + ST_DQ]
        .if ONES
        # The ones column's byte offset in a row of O.
        shl $m9, $m5, 4
        .endif
row:
        .if ONES
        add $m12, $m2, $m9
        ld32 $a5, [$m12]
        .else
        ld64 $a4:5, [$m6]+=8
        .endif
        f32recip $a6, $a5
        f32v2bcast $a6:7, $a6
        mov $m12, $m2
        mov $m13, $m3
        .if OUT == 32
        rpt $m5, 4
        ld64 $a0:1, [$m12]+=8
        { ld64 $a2:3, [$m12]+=8 ; f32v2mul $a0:1, $a0:1, $a6:7 }
        { st64 $a0:1, [$m13]+=8 ; f32v2mul $a2:3, $a2:3, $a6:7 }
        st64 $a2:3, [$m13]+=8
        .else
        rpt $m5, 6
        ld64 $a0:1, [$m12]+=8
        { ld64 $a2:3, [$m12]+=8 ; f32v2mul $a0:1, $a0:1, $a6:7 }
        f32v2mul $a2:3, $a2:3, $a6:7
        f32v2tof16 $a8, $a0:1
        f32v2tof16 $a9, $a2:3
        st64 $a8:9, [$m13]+=8
        .endif
        add $m2, $m2, $m7
        add $m3, $m3, $m8
        brnzdec $m4, row
        exit
