# fp8 GEMM worker vertex on the AMP unit: C = (A x B) * 2^SCALE (or
# C = C0 + (A x B) * 2^SCALE) for one worker's share, fp8 (F143) operands,
# f16 accumulation, f16 output (`ampf8`, 128 MAC/cycle/tile with six workers).
#
# The vertex computes C[m, c] = 2^SCALE * sum_k A[m, k] * B[k, c] for rows
# 0..M and the NCB column blocks of 16 columns starting at the state's B/C
# pointers, over NKB K blocks of 32 (the `ampf8` weight block is 32 x 16
# bytes). It has the vertex-state layout and memory contract of gemm_f16
# (docs/kernels.md) plus one word, SCALE: a K block of A is 32 bytes of a row
# (32 fp8, as 16 f16 are in gemm_f16), a column block of B is 16 bytes, a
# column block of C is 32 bytes (16 f16). Shapes, strides and the scale are
# read from the state at run time, so one object serves every shape and
# scale. Edge shapes follow the layout contract: K is padded to 32 and the
# column count to 16 with zero bytes in A and B, so padded products add
# exact zeros.
#
# Vertex state (u32 words, byte offsets):
#    0 A      address of A[0, 0]; row-major F143 bytes, K padded to 32
#             (region 1, 8-aligned)
#    4 RS_A   A row stride in bytes (a multiple of 8, at least 32 * NKB;
#             RS_A - 24 fits in signed 16 bits)
#    8 B      address of B[0, c0]; row-major F143 [NKB*32, ...] (region 1,
#             16-aligned)
#   12 RS_B   B row stride in bytes (a multiple of 16, at least 16 * NCB)
#   16 CA     f16 C buffer written by K block 0 (and 2, 4, ...), at row 0,
#             column c0
#   20 CB     f16 C buffer written by K block 1 (and 3, 5, ...); the result
#             of the last K block is in CA when NKB is odd, else in CB
#   24 RS_C   C row stride in bytes (both C buffers; a multiple of 8, at
#             least 32 * NCB; RS_C - 24 fits in signed 16 bits)
#   28 Z      address of 8 zero bytes in region 1 (the partials of K block 0),
#             or 0 for ACCUMULATE mode: K block 0 then reads its partials
#             from CB (rows 0..M+1 of the column block, RS_C apart), so the
#             vertex computes CA = CB + (A x B) * 2^SCALE over its first K
#             block and then alternates as usual
#   32 M      rows (>= 1)
#   36 NKB    K blocks of 32 (>= 1)
#   40 NCB    column blocks (>= 1)
#   44 SCALE  product scale exponent, a signed word: every product is
#             multiplied by 2^SCALE before it is accumulated (for operands
#             stored as x * 2^-sA and y * 2^-sB, SCALE = sA + sB restores
#             the true product)
#
# Why SCALE is a state word and not a `.param`: the fp8 scales of a graph's
# tensors are chosen per tensor, so a parameter would need one object per
# scale in use. `ampscale` takes only an immediate, so the vertex jumps into
# a table of `ampscale s` entries for s = -64..63, SCALE clamped to that
# range. The clamp is exact: a sum of 8 F143 products is a multiple of 2^-20
# below 2^19 (exact in f64). With s <= -44 every scaled product sum is below
# half the smallest f16 step (2^-25), so an accumulator rounds to 0 until
# its partial arrives and then to the partial, and stays there: the same
# bits as with s = -64 (up to the sign of zero). With s >= 38 every non-zero
# product sum is at least 2^18, beyond any f16 accumulator plus partial
# (below 2^17), so the accumulator becomes infinite (or NaN) with the sign
# of the products, as with s = 63; a zero product sum adds nothing at any
# scale. So any SCALE word gives the result of the exact product scale.
# The table costs 1 KiB of code.
#
# Memory contract (that of gemm_f16, checked by the compiler's storage
# validator):
# - A, CA and CB lie in pairwise disjoint interleaved memory elements (32 KiB):
#   the `ld2x64st64` of the inner loop loads A and one C buffer and stores the
#   other in the same instruction. Z (when not 0) lies in neither the element
#   set of CA nor that of A.
# - The vertex reads rows M and M+1 of A and of the partials buffer (the
#   pipeline runs one row ahead; their values feed only the drain), and it
#   writes rows -2 and -1 of its own column blocks in CA and CB (the outputs
#   of the pipeline before row 0). Those rows must exist and belong to no
#   other concurrently running worker.
#
# Pipeline (gemm_f16's with `ampf8`): each bundle `{ ld2x64st64 ; ampf8 }`
# loads the next 8 fp8 of x and 4 f16 partials, computes one phase (8 k rows
# by 16 columns), and stores the 4 f16 results of the previous amp; four
# phases per row, a row's results leave the AMP during the next row, so the
# stream has one extra (drain) row.

        .kernel gemm_fp8
        .workers 6
# Issue slots (x 6 tile cycles): 30 entry (with the scale table jump) and
# exit; per column block 16 of set-up (ACCUMULATE mode; 2 fewer with the
# zero word); per K block 4 per row plus 43: 33 for the weights (32 `ld128`
# paired with 32 `ampw`, the last beside the step of x to the block's A),
# the drain row's 4, preload, `rpt`, final store, the partials and output
# pointers and the loop branch.
        .cycles "6 * (30 + NCB * (16 + NKB * (4 * M + 43)))"

        .include "gemm_common.inc"
        .equ ST_SCALE, 44

# Bytes of one K block of an A row, of one column block of a B row and of a
# C row, and the row jump after a row's last 8-byte slot of A or C.
        .equ KBLOCK, 32
        .equ CBLOCK, 32
        .equ JUMP, 24

# The range of the scale table (see the header).
        .equ SCALE_MIN, -64
        .equ SCALE_MAX, 63

# Pace codes (gemm_common.inc): the low half of the stride pair is
# RS_A - 24 (next A row), the high half RS_C - 24 (next C row).

# Loads the 32x16 F143 weight block at $m8 into the AMP weight store: chunk
# i is B row i (16 bytes), rows RS_B apart ($m1 = RS_B). Leaves $m8 at the
# next K block's rows; with STEP=1 the last bundle also steps x to this K
# block's A ($m4 += $m9, gemm_common.inc).
        .macro LOAD_WEIGHTS step
        ld128 $a8:11, [$m8]+=$m1
        .set WI, 0
        .rept 15
        { ld128 $a12:15, [$m8]+=$m1 ; ampw $a8:11, WI }
        { ld128 $a8:11, [$m8]+=$m1 ; ampw $a12:15, WI + 1 }
        .set WI, WI + 2
        .endr
        { ld128 $a12:15, [$m8]+=$m1 ; ampw $a8:11, 30 }
        .if \step
        { add $m4, $m4, $m9 ; ampw $a12:15, 31 }
        .else
        ampw $a12:15, 31
        .endif
        .endm

# One bundle at row position P (0..3): loads x and the partials for the next
# phase, stores the previous phase's output. PN/PJ: pace of the partials
# stream in ordinary positions / at the row jump (HOLD for the zero word).
        .macro BUNDLE p, pn, pj
        .if \p == 0
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, INC | (\pn << 2) | (HI << 4) ; ampf8 $a4:5, $a0:1, $a2:3 }
        .elseif \p == 2
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, LO | (\pj << 2) | (INC << 4) ; ampf8 $a4:5, $a0:1, $a2:3 }
        .else
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, INC | (\pn << 2) | (INC << 4) ; ampf8 $a4:5, $a0:1, $a2:3 }
        .endif
        .endm

# One (column block, K block) product over all M rows. $m4 = A at this K
# block, $m5 = partials (or the zero word), $m6 = first (junk) output slot,
# $m14 = M + 1.
        .macro STREAM pn, pj
        ld2x64st64 $a0:3, $a4:5, $m4, $m7, INC | (\pn << 2) | (HOLD << 4)
        rpt $m14, 4
        .set BP, 0
        .rept 4
        BUNDLE BP, \pn, \pj
        .set BP, BP + 1
        .endr
        st64 $a4:5, [$m6]
        .endm

# Register use: GEMM_DRIVER's (gemm_common.inc), with $m1 = RS_B (one
# 16-byte chunk per B row) and $m10 the column-block byte offset in C
# (twice that in B).
        .text
        .globl gemm_fp8
        .entry gemm_fp8
gemm_fp8:
        # Product scale: jump to the table entry of clamp(SCALE), which sets
        # it and comes back to scale_set.
        ld32 $m2, [$m0 + ST_SCALE]
        max $m2, $m2, SCALE_MIN
        min $m2, $m2, SCALE_MAX
        shl $m2, $m2, 3
        setzi $m3, scale_table - 8 * SCALE_MIN
        add $m2, $m2, $m3
        br $m2
scale_set:
        GEMM_DRIVER 0, 1

# Entry s - SCALE_MIN (8 bytes each): `ampscale s`, back to scale_set.
scale_table:
        .set SV, SCALE_MIN
        .rept SCALE_MAX - SCALE_MIN + 1
        ampscale SV
        br scale_set
        .set SV, SV + 1
        .endr
