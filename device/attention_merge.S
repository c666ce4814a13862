# Flash attention with P V on the AMP (attention_online PV=1): after
# gemm_f16 ACC=32 has computed PV = P V in f32, this vertex forms the new
# accumulator O = f32(O * a + PV) (one fused rounding, `f32v2mac`) with a
# the rescaling factor attention_online stored per row.
#
# Vertex state (u32 words, byte offsets):
#    0 O      address of O[0, 0] (f32 [ROWS, 4*DQ], 8-aligned)
#    4 RS_O   O row stride in bytes (multiple of 8)
#    8 PV     address of PV[0, 0] (f32, 16-aligned, in interleaved memory):
#             the GEMM's C buffer, whose rows a quad loads with one `ld128`
#   12 RS_PV  PV row stride in bytes (multiple of 16)
#   16 ALPHA  address of ROWS f32 factors a
#   20 ROWS   rows (>= 1)
#   24 DQ     groups of four head columns (>= 1)
#
#   28 ML     (ONES=1 only) address of ROWS pairs (m, l) of f32, 8-aligned
#
# Each worker runs its own vertex over its own rows.
#
# ONES=1 (with attention_online ONES=1): V carried a column of ones at
# column 4 * DQ, so PV's column 4 * DQ is the sum of the block's p as the
# GEMM multiplied them; the vertex also forms l' = f32(l * a + that sum)
# (one fused rounding) in the row's state pair, five issue slots a row.
#
# Per quad of head columns: PV's quad as one `ld128`, O's two pairs as
# two `ld64` (O lies in standard memory), two `f32v2mac` and two `st64`:
# the main slot's 5 operations set 5 bundles (6 with PV as two `ld64`,
# until session 56).

        .kernel attention_merge
        .param ONES, 0
        .workers 6
        .if ONES == 0
        .cycles "6 * (10 + ROWS * (9 + 5 * DQ))"
        .elseif ONES == 1
        .cycles "6 * (11 + ROWS * (14 + 5 * DQ))"
        .else
        .error "ONES must be 0 (attention_online sums p into l) or 1 (l from PV's column 4 * DQ)"
        .endif

        .equ ST_O, 0
        .equ ST_RS_O, 4
        .equ ST_PV, 8
        .equ ST_RS_PV, 12
        .equ ST_ALPHA, 16
        .equ ST_ROWS, 20
        .equ ST_DQ, 24
        .equ ST_ML, 28

# $m2 O row, $m3 PV row, $m4 rows left - 1, $m5 DQ, $m6 ALPHA walk, $m7
# RS_O, $m8 RS_PV, $m9 (m, l) walk (ONES=1), $m12 O walk, $m13 PV walk;
# $a10:11 the pair (a, a).
        .text
        .globl attention_merge
        .entry attention_merge
attention_merge:
        ld32 $m2, [$m0 + ST_O]
        ld32 $m7, [$m0 + ST_RS_O]
        ld32 $m3, [$m0 + ST_PV]
        ld32 $m8, [$m0 + ST_RS_PV]
        ld32 $m6, [$m0 + ST_ALPHA]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m5, [$m0 + ST_DQ]
        .if ONES
        ld32 $m9, [$m0 + ST_ML]
        .endif
row:
        ld32 $a10, [$m6]+=4
        f32v2bcast $a10:11, $a10
        mov $m12, $m2
        mov $m13, $m3
        rpt $m5, 5
        ld128 $a0:3, [$m13]+=16
        ld64 $a4:5, [$m12 + 0]
        { ld64 $a6:7, [$m12 + 8] ; f32v2mac $a0:1, $a4:5, $a10:11 }
        { st64 $a0:1, [$m12]+=8 ; f32v2mac $a2:3, $a6:7, $a10:11 }
        st64 $a2:3, [$m12]+=8
        .if ONES
        # $m13 has walked to PV's column 4 * DQ: l' = l a + the sum.
        ld32 $a0, [$m13]
        ld32 $a1, [$m9 + 4]
        f32mac $a0, $a1, $a10
        st32 $a0, [$m9 + 4]
        add $m9, $m9, 8
        .endif
        add $m2, $m2, $m7
        add $m3, $m3, $m8
        brnzdec $m4, row
        exit
