# f16 GEMM worker vertex on the AMP unit: C = A x B for one worker's share.
#
# Specialisations (-D):
#   ACC=16 (default): ampf16, f16 accumulation, f16 output (64 MAC/cycle/tile).
#   ACC=32:           ampf16f32, f32 accumulation, f32 output (32 MAC/cycle/tile).
#
# The vertex computes C[m, c] = sum_k A[m, k] * B[k, c] for rows 0..M and the
# NCB column blocks of 16 columns starting at the state's B/C pointers, over
# NKB K blocks of 16. Shapes and strides are read from the vertex state at run
# time, so one object serves every shape. Edge shapes are handled by the
# layout contract (docs/kernels.md): K and the column count are padded to 16
# with zeros in A and B, so padded products add exact zeros.
#
# Vertex state (u32 words, byte offsets):
#    0 A      address of A[0, 0]; row-major, K padded to 16 (region 1)
#    4 RS_A   A row stride in bytes (multiple of 32, at most 32767 + 24)
#    8 B      address of B[0, c0]; row-major [NKB*16, ...] (region 1, 16-aligned)
#   12 RS_B   B row stride in bytes (multiple of 16)
#   16 CA     C buffer written by K block 0 (and 2, 4, ...), at row 0, column c0
#   20 CB     C buffer written by K block 1 (and 3, 5, ...); the result of the
#             last K block is in CA when NKB is odd, else in CB
#   24 RS_C   C row stride in bytes (both C buffers; at most 32767 + 56)
#   28 Z      address of 8 zero bytes in region 1 (the partials of K block 0),
#             or 0: accumulate, K block 0 reads its partials from CB (the
#             running sum of earlier calls, RS_C apart, rows M and M+1
#             included), so CA = CB + A x B over the first K block. A GEMM
#             whose K arrives in chunks by successive exchange steps calls
#             the vertex once per chunk and swaps CA and CB as the parity
#             rule below says.
#   32 M      rows (>= 1)
#   36 NKB    K blocks (>= 1)
#   40 NCB    column blocks (>= 1)
#
# Memory contract (checked by the compiler's storage validator):
# - A, CA and CB lie in pairwise disjoint interleaved memory elements (32 KiB):
#   the `ld2x64st64` of the inner loop loads A and one C buffer and stores the
#   other in the same instruction. Z lies in neither the element set of CA nor
#   that of A.
# - The vertex reads rows M and M+1 of A and of the partials buffer (the
#   pipeline runs one row ahead; their values feed only the drain), and it
#   writes rows -2 and -1 of its own column blocks in CA and CB (the outputs
#   of the pipeline before row 0). Those rows must exist and belong to no
#   other concurrently running worker.
#
# Pipeline: each bundle `{ ld2x64st64 ; amp }` loads the operands of the next
# amp, computes one phase, and stores the result of the previous amp; a
# row's results leave the AMP during the next row, so the stream has one
# extra (drain) row.

        .kernel gemm_f16
        .param ACC, 16
        .workers 6
# Issue slots (x 6 tile cycles): 22 entry and exit; per column block 14 of
# set-up and loop control (15 with ACC=32, which doubles the C offset);
# per K block PHASES per row plus 43 (47 with ACC=32): 33 for the weights
# (32 `ld128` paired with 32 `ampw`, the last beside the step of x to the
# block's A), the drain row, preload, `rpt`, final store, the partials and
# output pointers and the loop branch. Measured equal on the simulator
# (tests/kernel_gemm.rs) apart from the supervisor's launches.
        .if ACC == 16
        .cycles "6 * (22 + NCB * (14 + NKB * (4 * M + 43)))"
        .elseif ACC == 32
        .cycles "6 * (22 + NCB * (15 + NKB * (8 * M + 47)))"
        .else
        .error "ACC must be 16 (f16 accumulation) or 32 (f32 accumulation)"
        .endif

        .include "gemm_common.inc"

        .if ACC == 16
        # Phases per row, bytes of a 16-column C block row, and the row jump
        # after a row's last 8-byte slot of C.
        .equ PHASES, 4
        .equ CBLOCK, 32
        .equ CJUMP, 24
        .else
        .equ PHASES, 8
        .equ CBLOCK, 64
        .equ CJUMP, 56
        .endif

# Pace codes (gemm_common.inc): the low half of the stride pair is
# RS_A - 24 (next A row), the high half RS_C - CJUMP (next C row).

# Loads the 16x16 f16 weight block at $m8 (rows RS_B apart) into the AMP
# weight store, two 16-byte chunks per row; $m1 = RS_B - 16. Leaves $m8 at
# the next K block's rows. With STEP=1 the last bundle's free main slot also
# steps the x stream from where the previous K block's STREAM left it to
# this K block's A ($m4 += $m9, see the register use below).
        .macro LOAD_WEIGHTS step
        ld128 $a8:11, [$m8]+=16
        .set WI, 0
        .rept 15
        { ld128 $a12:15, [$m8]+=$m1 ; ampw $a8:11, WI }
        { ld128 $a8:11, [$m8]+=16 ; ampw $a12:15, WI + 1 }
        .set WI, WI + 2
        .endr
        { ld128 $a12:15, [$m8]+=$m1 ; ampw $a8:11, 30 }
        .if \step
        { add $m4, $m4, $m9 ; ampw $a12:15, 31 }
        .else
        ampw $a12:15, 31
        .endif
        .endm

        .if ACC == 16
# One f16 bundle at row position P (0..3): loads x and the partials for the
# next phase, stores the previous phase's output. PN/PJ: pace of the partials
# stream in ordinary positions / at the row jump (HOLD for the zero word).
        .macro BUNDLE p, pn, pj
        .if \p == 0
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, INC | (\pn << 2) | (HI << 4) ; ampf16 $a4:5, $a0:1, $a2:3 }
        .elseif \p == 2
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, LO | (\pj << 2) | (INC << 4) ; ampf16 $a4:5, $a0:1, $a2:3 }
        .else
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, INC | (\pn << 2) | (INC << 4) ; ampf16 $a4:5, $a0:1, $a2:3 }
        .endif
        .endm

        .macro PRELOAD pn
        ld2x64st64 $a0:3, $a4:5, $m4, $m7, INC | (\pn << 2) | (HOLD << 4)
        .endm
        .else
# One f32-accumulating bundle at row position P (0..7). Odd positions load
# the next x pair and partials (ld2x64st64: $m4 x, $m5 P, $m6 S); even
# positions load only partials (ld64st64: $m5 P, $m6 S). Amp j takes x from
# $a0 when j is even and from $a1 when j is odd.
        .macro BUNDLE p, pn, pj
        .if \p & 1
        .if \p == 5
        .set XP, LO
        .else
        .set XP, INC
        .endif
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, XP | (\pn << 2) | (INC << 4) ; ampf16f32 $a4:5, $a1, $a2:3 }
        .elseif \p == 0
        { ld64st64 $a2:3, $a4:5, $m5, $m7, \pn | (HI << 2) ; ampf16f32 $a4:5, $a0, $a2:3 }
        .elseif \p == 6
        { ld64st64 $a2:3, $a4:5, $m5, $m7, \pj | (INC << 2) ; ampf16f32 $a4:5, $a0, $a2:3 }
        .else
        { ld64st64 $a2:3, $a4:5, $m5, $m7, \pn | (INC << 2) ; ampf16f32 $a4:5, $a0, $a2:3 }
        .endif
        .endm

        .macro PRELOAD pn
        ld2x64st64 $a0:3, $a4:5, $m4, $m7, INC | (\pn << 2) | (HOLD << 4)
        .endm
        .endif

# One (column block, K block) product over all M rows. $m4 = A at this K
# block, $m5 = partials (or the zero word), $m6 = first (junk) output slot,
# $m14 = M + 1.
        .macro STREAM pn, pj
        PRELOAD \pn
        rpt $m14, PHASES
        .set BP, 0
        .rept PHASES
        BUNDLE BP, \pn, \pj
        .set BP, BP + 1
        .endr
        st64 $a4:5, [$m6]
        .endm

# Register use: $m0 state, $m1 RS_B - 16, $m2 column blocks left, $m3 K
# blocks left, $m4/$m5/$m6 x/partials/output streams, $m7 stride pair,
# $m8 weight rows, $m9 24 - (M + 1) RS_A (a STREAM advances x by one
# access and M + 1 rows, so this steps it to the next K block's A, 32 bytes
# on), $m10 column-block byte offset in B, $m11 CA and $m12 CB at this
# column block, $m13 2 * RS_C - CJUMP (offset of the first junk slot),
# $m14 M + 1.
#
# The K-block loop is unrolled by two, one copy per parity: odd K blocks
# write CB from CA's partials and even ones CA from CB's, so no block swaps
# buffer registers (a swap took three `mov`; each copy sets only the
# partials pointer), and x steps to the block's A inside the weight load:
# 4 bundles a K block fewer than the single body with a swap.
        .text
        .globl gemm_f16
        .entry gemm_f16
gemm_f16:
        ld32 $m13, [$m0 + ST_RS_A]
        ld32 $m14, [$m0 + ST_M]
        add $m14, $m14, 1
        mul $m9, $m14, $m13
        setzi $m3, 24
        sub $m9, $m3, $m9
        add $m13, $m13, -24
        shl $m13, $m13, 16
        shr $m13, $m13, 16
        ld32 $m3, [$m0 + ST_RS_C]
        add $m3, $m3, -CJUMP
        shl $m3, $m3, 16
        or $m7, $m13, $m3
        ld32 $m13, [$m0 + ST_RS_C]
        add $m13, $m13, $m13
        add $m13, $m13, -CJUMP
        ld32 $m1, [$m0 + ST_RS_B]
        add $m1, $m1, -16
        ld32 $m2, [$m0 + ST_NCB]
        add $m2, $m2, -1
        setzi $m10, 0
cb_loop:
        ld32 $m8, [$m0 + ST_B]
        add $m8, $m8, $m10
        ld32 $m4, [$m0 + ST_A]
        .if ACC == 16
        ld32 $m11, [$m0 + ST_CA]
        add $m11, $m11, $m10
        ld32 $m12, [$m0 + ST_CB]
        add $m12, $m12, $m10
        .else
        add $m3, $m10, $m10
        ld32 $m11, [$m0 + ST_CA]
        add $m11, $m11, $m3
        ld32 $m12, [$m0 + ST_CB]
        add $m12, $m12, $m3
        .endif
        ld32 $m3, [$m0 + ST_NKB]
        add $m3, $m3, -1
        # K block 0: the partials are the zero word, held in place, or with
        # Z = 0 the running sum in CB, streamed like a later block's.
        LOAD_WEIGHTS 0
        ld32 $m5, [$m0 + ST_Z]
        sub $m6, $m11, $m13
        brz $m5, kb0_accumulate
        STREAM HOLD, HOLD
        br kb0_done
kb0_accumulate:
        mov $m5, $m12
        STREAM INC, HI
kb0_done:
        brz $m3, cb_done
        add $m3, $m3, -1
kb_odd:
        # An odd K block: CB = CA's partials + A x B at this block.
        LOAD_WEIGHTS 1
        mov $m5, $m11
        sub $m6, $m12, $m13
        STREAM INC, HI
        brnzdec $m3, kb_even
        # The column block's last K block was odd: its end, as cb_done's.
        add $m10, $m10, 32
        brnzdec $m2, cb_loop
        exit
kb_even:
        # An even K block: CA = CB's partials + A x B at this block.
        LOAD_WEIGHTS 1
        mov $m5, $m12
        sub $m6, $m11, $m13
        STREAM INC, HI
        brnzdec $m3, kb_odd
cb_done:
        add $m10, $m10, 32
        brnzdec $m2, cb_loop
        exit
