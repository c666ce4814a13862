# Sum of P f32 partial matrices, stored as f16 (OUT=16, round to nearest
# even) or f32 (OUT=32): the last step of a GEMM whose K blocks were split
# over workers (each worker accumulates its own f32 partial) or, with P = 1,
# the f32 -> f16 conversion of an f32-accumulated GEMM with an f16 result.
#
# IN=16: the partials are f16 instead (split-K over tiles of a GEMM
# accumulated in f16, each tile holding an f16 partial of the same block).
# Each partial is widened to f32 exactly (f16v2tof32, two per group of four)
# and summed like IN=32; the state layout is the same, with f16 elements,
# and SRC, SECTION and RS_SRC need only be multiples of 8 (64-bit loads,
# any region).
#
# Epilogues (EPI), fused so that the GEMM's consumers never need a pass
# of their own; each intermediate is rounded to f16 where the graph stores
# it (docs/graph-format.md), the arithmetic runs in f32:
#   EPI=0  y = f16(sum)
#   EPI=1  y = f16(f16(sum) + bias[col])
#   EPI=2  y = f16(gelu(f16(f16(sum) + bias[col])))
#   EPI=3  y = f16(gelu(f16(sum)))
# With OUT=32 (IN=32 only: an f32 GEMM's partials) every value is f32 and
# the bias is f32: y = sum + bias[col], gelu(sum + bias[col]), gelu(sum).
# gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#
# Vertex state (u32 words, byte offsets):
#    0 SRC      address of row 0, column 0 of partial 0 (IN=32: region 1,
#               16-aligned; IN=16: 8-aligned, any region)
#    4 SECTION  bytes from one partial to the next (multiple of 16; IN=16: 8)
#    8 P        partials (>= 1)
#   12 RS_SRC   partial row stride in bytes (multiple of 16; IN=16: 8)
#   16 DST      address of row 0 of the result (8-aligned; TR=1: of
#               element (0, 0), 2-aligned)
#   20 RS_DST   result row stride in bytes (multiple of 8; TR=1: the
#               column stride, even)
#   24 ROWS     rows (>= 1)
#   28 QUADS    groups of 4 elements per row (>= 1)
#   32 BIAS     address of the bias of column 0 (f16; f32 with OUT=32;
#               8-aligned; EPI 1 and 2)
#   36 OWN      PAIRS=1 or OWN=1 only: the address of partial 0's row 0 (RS_SRC
#               apart like the others), or 0: partial 0 at SRC. With OWN,
#               partials 1..P-1 stay at SRC + p * SECTION and SRC's slot 0
#               is never read: a reduce-scatter leaves the tile's own piece
#               where its GEMM wrote it instead of copying it into the
#               gather. PAIRS=1: OWN needs the two-partial path's
#               placement (below) and OWN = SRC mod 16 in region 1; a
#               vertex given OWN where that path cannot run faults (a load
#               from address 0). OWN=1 (ACC=16 TR=1): any 8-aligned OWN,
#               2 <= P <= 8, else the same fault.
#
# Sums run in f32 in partial order (p = 0, 1, ...), one rounding per add,
# then one conversion: each group of four costs about 2P + 7 bundles (IN=16:
# 4P + 5, the widening doubles the arithmetic per partial).
#
# TR=1 (IN=16 and OUT=16 only): the result is stored transposed, so that the
# compiler needs no transpose_f16 pass after the reduce. Element (row r,
# column c) goes to DST + c * RS_DST + 2 * r: RS_DST is then the stride
# between result COLUMNS (the transposed rows; a multiple of 8 is not
# needed, only an even value), and a column's ROWS elements are consecutive
# f16. DST need only be 2-aligned. Values, sums and rounding are those of
# TR=0; only the addresses change. Each element is one st16 (2 bytes), so
# vertices that split the rows may share a 4-byte word of a column and
# nothing outside the ROWS x 4*QUADS elements is written. EPI=0: the four
# st16, the two pack16hi that bring lanes 1 and 3 into a low half, and a
# read-ahead of the next group's partial 0 fill the main and arithmetic
# slots of the tail: 4P + 6 bundles per group (one more than TR=0). EPI
# 1..3: three bundles per group more than TR=0. ACC=16 TR=1 stores blocks
# of four rows with one st64 per column where their 8 bytes are 8-aligned
# (below); the rest one element at a time, so the guarantees are the same.
# ACC=16 EPI=1 TR=1 (the bias add, for biased projections into the column
# attention layout) has the same blocks of four rows for 2 <= P <= 8, the
# bias taking the place of one more partial, and stores the other rows one
# element at a time.

        .kernel reduce_f32
        .param OUT, 16
        .param EPI, 0
        .param IN, 32
        .param TR, 0
        .param ACC, 32
        .param PAIRS, 0
        .param OWN, 0
        .workers 6
        .if OUT != 16 && OUT != 32
        .error "OUT must be 16 (f16 result) or 32 (f32 result)"
        .endif
        .if IN != 16 && IN != 32
        .error "IN must be 16 (f16 partials) or 32 (f32 partials)"
        .endif
        .if EPI < 0 || EPI > 3 || (EPI != 0 && OUT != 16 && (IN != 32 || ACC != 32 || TR != 0))
        .error "EPI must be 0..3, and epilogues with OUT=32 need IN=32 (f32 partials)"
        .endif
        .if (TR != 0 && TR != 1) || (TR == 1 && (IN != 16 || OUT != 16))
        .error "TR must be 0 or 1, and TR=1 (transposed result) needs IN=16 and OUT=16"
        .endif
        .if (ACC != 16 && ACC != 32) || (ACC == 16 && (IN != 16 || OUT != 16 || EPI > 2 || (EPI == 2 && TR != 0)))
        .error "ACC must be 32 (f32 sums) or 16 (f16 sums), and ACC=16 needs IN=16, OUT=16 and EPI 0, 1 or 2 (EPI=2 with TR=0)"
        .endif
        .if (PAIRS != 0 && PAIRS != 1) || (PAIRS == 1 && (ACC != 16 || EPI != 0 || TR != 0))
        .error "PAIRS must be 0 or 1, and PAIRS=1 (two partials per load) needs ACC=16, EPI=0 and TR=0"
        .endif
        .if (OWN != 0 && OWN != 1) || (OWN == 1 && (ACC != 16 || EPI != 0 || TR != 1))
        .error "OWN must be 0 or 1, and OWN=1 (partial 0 at state word OWN) needs ACC=16, EPI=0 and TR=1 (PAIRS=1 reads OWN without it)"
        .endif
        # ACC=16: the step (2 * P) / (P + 9) is 0 for P <= 8 (unrolled
        # groups: P + 1 or P + 4 bundles, TR=0 with two partials per load
        # P - 1) and 1 for every larger P (the generic loop: P + 3 bundles
        # per group, five per row).
        # ACC=16 EPI 1 and 2: the same step S; P = 1 EPI=1 costs one
        # bundle more per row (1 / P).
        # ACC=16 EPI=1 TR=1, for a DST whose row 0 is 8-aligned and RS_DST
        # a multiple of 8 (the compiler's layout). P = 1 and P > 8 (U + S
        # = 1, U = 1 / P): the one-row paths of TR=0 with each group's
        # st64 replaced by four st16 and two pack16hi (ACC16_STORE), three
        # bundles more per group, four more at the entry (the column
        # walk's row step) and three for the dispatch. 2 <= P <= 8: with
        # fewer than four rows the one-row path after the whole dispatch
        # (52 bundles of set-up); else 64 bundles of set-up, dispatch,
        # prologue, drain and launch, B = ROWS / 4 blocks of four rows at
        # QUADS (4P + 8) + 2 bundles per block row, t = ROWS mod 4 rows on
        # the one-row path at QUADS (P + 5) + 2 each, and 3 more when t >
        # 0 (the way there).
        .if ACC == 16 && EPI == 1 && TR == 1
        .cycles "6 * ((1 / P + (2 * P) / (P + 9)) * (40 + 4 * ((2 * P) / (P + 9)) + ROWS * (2 + 1 / P + 3 * ((2 * P) / (P + 9)) + QUADS * (P + 5 + 3 * ((2 * P) / (P + 9))))) + (1 - 1 / P - (2 * P) / (P + 9)) * ((1 / ((ROWS / 4) + 1)) * (52 + ROWS * (2 + QUADS * (P + 5))) + (1 - 1 / ((ROWS / 4) + 1)) * (64 + (ROWS / 4) * (2 + QUADS * (4 * P + 8)) + (ROWS - 4 * (ROWS / 4)) * (2 + QUADS * (P + 5)) + 3 * (1 - 1 / ((ROWS - 4 * (ROWS / 4)) + 1)))))"
        .elseif ACC == 16 && EPI == 1
        .cycles "6 * (33 + 4 * ((2 * P) / (P + 9)) + ROWS * (2 + 1 / P + 3 * ((2 * P) / (P + 9)) + QUADS * (P + 2 + 3 * ((2 * P) / (P + 9)))))"
        .elseif ACC == 16 && EPI == 2
        .cycles "6 * (35 + 4 * ((2 * P) / (P + 9)) + ROWS * (2 + 3 * ((2 * P) / (P + 9)) + QUADS * (P + 9 + 5 * ((2 * P) / (P + 9)))))"
        .elseif ACC == 16 && TR == 1
        # ACC=16 TR=1, for a DST whose row 0 is 8-aligned and RS_DST a
        # multiple of 8 (the compiler's layout): 47 bundles of setup,
        # dispatch and launch; B = ROWS / 4 blocks of four rows at QUADS
        # (4P + 4) + 2 bundles per block row; t = ROWS mod 4 rows on the
        # one-row path at QUADS (P + 4) + 2 each; when B > 0, 9 more for the
        # four-row path's prologue and drain, and 3 more when t > 0 too (the
        # way from it to the one-row path). 1 - 1 / (X + 1) is 1 for X > 0,
        # else 0. P > 8 (S = 1) keeps the generic one-row loop. OWN=1: 18
        # bundles more at the entry (the walk's start, E, the steps and the
        # check), with or without OWN.
        .if OWN == 1
        .cycles "6 * (((2 * P) / (P + 9)) * (53 + ROWS * (5 + QUADS * (P + 6))) + (1 - ((2 * P) / (P + 9))) * (65 + (ROWS - 4 * (ROWS / 4)) * (2 + QUADS * (P + 4)) + (1 - 1 / ((ROWS / 4) + 1)) * (9 + 3 * (1 - 1 / ((ROWS - 4 * (ROWS / 4)) + 1))) + (ROWS / 4) * (2 + QUADS * (4 * P + 4))))"
        .else
        .cycles "6 * (((2 * P) / (P + 9)) * (35 + ROWS * (5 + QUADS * (P + 6))) + (1 - ((2 * P) / (P + 9))) * (47 + (ROWS - 4 * (ROWS / 4)) * (2 + QUADS * (P + 4)) + (1 - 1 / ((ROWS / 4) + 1)) * (9 + 3 * (1 - 1 / ((ROWS - 4 * (ROWS / 4)) + 1))) + (ROWS / 4) * (2 + QUADS * (4 * P + 4))))"
        .endif
        .elseif ACC == 16 && PAIRS == 0
        .cycles "6 * (29 + 6 * ((2 * P) / (P + 9)) + ROWS * (2 + 3 * ((2 * P) / (P + 9)) + QUADS * (P + 1 + 2 * ((2 * P) / (P + 9)))))"
        .elseif ACC == 16
        # ACC=16 TR=0 EPI=0 PAIRS=1, for partials in region 1 with SECTION = 8 mod
        # 16 and the result in region 0 (the compiler's layout): two
        # partials per load for P <= 8 (S = 0): 80 bundles of checks,
        # set-up, dispatch, prologue, drain and launch (16 of them for
        # OWN, taken without a branch so that both kinds of vertex cost
        # the same); QUADS (P - 1)
        # bundles per row (P = 1: QUADS, 1 / P being 1 only for P = 1), and
        # 2 more (rpt and brnzdec) when QUADS >= 3 (1 - 1 / (QUADS / 3 + 1)
        # is 1 for QUADS >= 3, else 0). P > 8 (S = 1) keeps the generic
        # loop, after the 35 bundles of the checks. Other layouts take the
        # one-load path, whose cost (35 bundles more than before the
        # two-partial path: 6 * (64 + ROWS * (2 + QUADS * (P + 1))) for P
        # <= 8) this formula does not describe.
        .cycles "6 * (((2 * P) / (P + 9)) * (70 + ROWS * (5 + QUADS * (P + 3))) + (1 - ((2 * P) / (P + 9))) * (80 + ROWS * (QUADS * (P - 1 + 1 / P) + 2 * (1 - 1 / (QUADS / 3 + 1)))))"
        .elseif TR == 1 && EPI == 0
        .cycles "6 * (26 + ROWS * (6 + QUADS * (4 * P + 6)))"
        .elseif TR == 1 && EPI == 1
        .cycles "6 * (17 + ROWS * (7 + QUADS * (4 * P + 16)))"
        .elseif TR == 1 && EPI == 2
        .cycles "6 * (18 + ROWS * (7 + QUADS * (4 * P + 40)))"
        .elseif TR == 1
        .cycles "6 * (17 + ROWS * (6 + QUADS * (4 * P + 32)))"
        .elseif IN == 16 && OUT == 32
        .cycles "6 * (16 + ROWS * (6 + QUADS * (4 * P + 4)))"
        .elseif IN == 16 && EPI == 0
        .cycles "6 * (16 + ROWS * (6 + QUADS * (4 * P + 5)))"
        .elseif IN == 16 && EPI == 1
        .cycles "6 * (17 + ROWS * (7 + QUADS * (4 * P + 13)))"
        .elseif IN == 16 && EPI == 2
        .cycles "6 * (18 + ROWS * (7 + QUADS * (4 * P + 37)))"
        .elseif IN == 16
        .cycles "6 * (17 + ROWS * (6 + QUADS * (4 * P + 29)))"
        .elseif EPI == 0
        .cycles "6 * (8 + ROWS * (3 + QUADS * (2 * P + 7)))"
        .elseif OUT == 32 && EPI == 1
        .cycles "6 * (8 + ROWS * (4 + QUADS * (2 * P + 10)))"
        .elseif OUT == 32 && EPI == 2
        .cycles "6 * (8 + ROWS * (4 + QUADS * (2 * P + 30)))"
        .elseif OUT == 32
        .cycles "6 * (8 + ROWS * (4 + QUADS * (2 * P + 27)))"
        .elseif EPI == 1
        .cycles "6 * (8 + ROWS * (4 + QUADS * (2 * P + 16)))"
        .elseif EPI == 2
        .cycles "6 * (8 + ROWS * (4 + QUADS * (2 * P + 40)))"
        .else
        .cycles "6 * (8 + ROWS * (4 + QUADS * (2 * P + 32)))"
        .endif

        .equ ST_SRC, 0
        .equ ST_SECTION, 4
        .equ ST_P, 8
        .equ ST_RS_SRC, 12
        .equ ST_DST, 16
        .equ ST_RS_DST, 20
        .equ ST_ROWS, 24
        .equ ST_QUADS, 28
        .equ ST_BIAS, 32
        # PAIRS=1 only: partial 0's own address (see the state words above).
        .equ ST_OWN, 36

# The shift of partial 0's walk from SRC ($m2) to state word OWN, in \own
# as loaded: \own = OWN - SRC when OWN is not 0, else 0, and \mask all
# ones when OWN is not 0, else 0. Branch-free, so that vertices with and
# without OWN cost the same.
        .macro OWN_SHIFT own, mask
        cmpne \mask, \own, $mzero
        sub \mask, $mzero, \mask
        sub \own, \own, $m2
        and \own, \own, \mask
        .endm

# GELU of the f32 pair \x in place; temporaries $a0:3 and $a12:13, the
# constant pairs at $m0 (c1, sqrt(2/pi), 1, 0.5).
        .macro GELU x
        { ld64 $a12:13, [$m0 + 0] ; f32v2mul $a0:1, \x, \x }
        f32v2mul $a0:1, $a0:1, \x
        mov64 $a2:3, \x
        { ld64 $a12:13, [$m0 + 8] ; f32v2mac $a2:3, $a0:1, $a12:13 }
        f32v2mul $a2:3, $a2:3, $a12:13
        { ld64 $a12:13, [$m0 + 16] ; f32v2tanh $a2:3, $a2:3 }
        f32v2add $a2:3, $a2:3, $a12:13
        { ld64 $a12:13, [$m0 + 24] ; f32v2mul $a2:3, $a2:3, \x }
        f32v2mul \x, $a2:3, $a12:13
        .endm

        .if ACC == 16
# ACC=16: the sums run in f16. Per element s = p0, then s = f16(s + p) for
# p = p1, ..., p(P-1) in partial order (f16v4add: the exact sum rounded
# once to nearest even), and s is stored as it is: no widening, no
# conversion. The main slot is the bound (P loads and the store(s) of a
# group; the arithmetic slot has P - 1 adds), so the groups of one row are
# software-pipelined in a hardware loop whose body is unrolled for each P
# up to ACC16_UNROLLED (P + 1 bundles, TR=1: P + 4), picked once per vertex
# through a table of branches; larger P take a generic loop (P + 3 bundles,
# TR=1: P + 6). TR=1 uses this one-row path only for the rows that cannot
# be stored four at a time with st64 (see "four rows at a time" below),
# and then continues at $m14 instead of exiting. TR=0 EPI=0 uses it only
# where the memory does not allow two partials per load with ld2x64st64
# (P - 1 bundles per group; see "two partials per load" after the
# generic loop, and the checks at the entry).
#
# Unrolled, a group's body loads partials 1..P-1 (each add one bundle
# behind its load), then reads ahead the next group's partial 0 beside the
# last add, then stores. A row's last group is peeled out of the hardware
# loop: its last load steps the walk to the next row, and its final add and
# store(s) run at the top of the next row beside that row's partial 0 load
# (or after the last row, which reads nothing past itself). So every row
# costs QUADS * (P + 1) + 2 bundles (rpt and brnzdec).
#
# $a0:1 the partial just loaded, $a2:3 partial 0 (read ahead), $a4:5 the
# sum; TR=1: $a6, $a7 lanes 1 and 3 moved into low halves for st16.
# $m0 = 8 - (P-1) SECTION: from a group's last partial to the next group's
# partial 0; $m1 = RS_SRC - 8 (QUADS-1) - (P-1) SECTION: from a row's last
# partial load to the next row's partial 0; $m2 the partial walk; $m3 the
# result walk; $m4 rows left; $m6 the walk of P = 1 (no read-ahead); $m7
# from a row's last store to the next row's first (TR=0: RS_DST - 8
# (QUADS-1); TR=1: 2 - (4 QUADS - 1) RS_DST, from column 4 QUADS - 1 back
# to column 0 of the next row); $m8 SECTION; $m9 P; $m10 QUADS - 1 (the
# hardware loop's count); $m11 RS_SRC; $m12 RS_DST; TR=1: $m14 where to
# go after the last row.
        .equ ACC16_UNROLLED, 8

# The final add of a group: partial P-1 into the sum (P = 2: onto partial 0).
        .macro ACC16_FINAL_ADD P
        .if \P == 2
        f16v4add $a4:5, $a2:3, $a0:1
        .else
        f16v4add $a4:5, $a4:5, $a0:1
        .endif
        .endm

# The final add beside the read-ahead of the next partial 0 (the add reads
# $a2:3 before the load writes it).
        .macro ACC16_FINAL_ADD_LOAD P
        .if \P == 2 && OWN == 1
        { ld64 $a2:3, [$m2]+=$m6 ; f16v4add $a4:5, $a2:3, $a0:1 }
        .elseif \P == 2
        { ld64 $a2:3, [$m2]+=$m8 ; f16v4add $a4:5, $a2:3, $a0:1 }
        .elseif OWN == 1
        { ld64 $a2:3, [$m2]+=$m6 ; f16v4add $a4:5, $a4:5, $a0:1 }
        .else
        { ld64 $a2:3, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        .endif
        .endm

# Loads of partials 1..P-1 of a group with the adds of partials 1..P-2,
# one bundle behind; the last load steps the walk by \last.
        .macro ACC16_LOADS P, last
        .if \P == 2
        ld64 $a0:1, [$m2]+=\last
        .elseif \P == 3
        ld64 $a0:1, [$m2]+=$m8
        { ld64 $a0:1, [$m2]+=\last ; f16v4add $a4:5, $a2:3, $a0:1 }
        .else
        ld64 $a0:1, [$m2]+=$m8
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add $a4:5, $a2:3, $a0:1 }
        .rept \P - 4
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        .endr
        { ld64 $a0:1, [$m2]+=\last ; f16v4add $a4:5, $a4:5, $a0:1 }
        .endif
        .endm

# The store of a group's four results from the pair \pair (\lo, \hi), the
# result walk stepped by \last after it. TR=1: one st16 per column (RS_DST apart), lanes 1 and
# 3 brought into low halves by pack16hi beside the stores.
        .macro ACC16_STORE pair, lo, hi, last
        .if TR == 1
        { st16 \lo, [$m3]+=$m12 ; pack16hi $a6, \lo, \lo }
        { st16 $a6, [$m3]+=$m12 ; pack16hi $a7, \hi, \hi }
        st16 \hi, [$m3]+=$m12
        st16 $a7, [$m3]+=\last
        .else
        st64 \pair, [$m3]+=\last
        .endif
        .endm

# TR=1's result walk from a row's last column to column 0 of the next
# row: $m7 = 2 - (4 QUADS - 1) RS_DST ($m10 = QUADS - 1, $m12 = RS_DST).
        .macro TR_ROW_STEP
        shl $m7, $m10, 2
        add $m7, $m7, 3
        mul $m7, $m7, $m12
        sub $m7, $mzero, $m7
        add $m7, $m7, 2
        .endm

# The store of the sum pair $a4:5 followed by the next group of its row:
# the next four elements (TR=0), or the next column (TR=1, whose four
# stores step one column each).
        .macro ACC16_STORE_NEXT
        .if TR == 1
        ACC16_STORE $a4:5, $a4, $a5, $m12
        .else
        ACC16_STORE $a4:5, $a4, $a5, 8
        .endif
        .endm

        .if TR == 1
        .equ ACC16_STORE_BUNDLES, 4
        .else
        .equ ACC16_STORE_BUNDLES, 1
        .endif

# The end of the one-row path. TR=1: the rows it ran may be only the head
# (before the first 8-aligned row) or the tail (after the last block of
# four) of the vertex's rows, so it continues at $m14 (the four-row path,
# or an exit).
        .macro ACC16_ROWS_DONE
        .if TR == 1
        br $m14
        .else
        exit
        .endif
        .endm

# The rows of one unrolled P, entered at acc16_first_P with the first row's
# partial 0 in $a2:3 (P = 1: nothing read yet).
        .macro ACC16_UNROLLED_ROWS P
        .if \P == 1
        # A copy: no sum, no read-ahead.
acc16_first_\P:
        rpt $m10, 1 + ACC16_STORE_BUNDLES
        ld64 $a2:3, [$m6]+=8
        .if TR == 1
        ACC16_STORE $a2:3, $a2, $a3, $m12
        .else
        ACC16_STORE $a2:3, $a2, $a3, 8
        .endif
        ld64 $a2:3, [$m6]+=$m1
        ACC16_STORE $a2:3, $a2, $a3, $m7
        brnzdec $m4, acc16_first_\P
        ACC16_ROWS_DONE
        .else
acc16_row_\P:
        # The previous row's last group: final add beside this row's
        # partial 0, then its store(s).
        ACC16_FINAL_ADD_LOAD \P
        ACC16_STORE $a4:5, $a4, $a5, $m7
acc16_first_\P:
        rpt $m10, \P + ACC16_STORE_BUNDLES
        ACC16_LOADS \P, $m0
        ACC16_FINAL_ADD_LOAD \P
        .if TR == 1
        ACC16_STORE $a4:5, $a4, $a5, $m12
        .else
        ACC16_STORE $a4:5, $a4, $a5, 8
        .endif
        ACC16_LOADS \P, $m1
        brnzdec $m4, acc16_row_\P
        ACC16_FINAL_ADD \P
        ACC16_STORE $a4:5, $a4, $a5, $m7
        ACC16_ROWS_DONE
        .endif
        .endm

# ACC=16 TR=1, four rows at a time. The one-row path above stores each
# element with its own st16, so its main slot carries P loads and four
# stores per group (P + 4 bundles). When the 8 bytes of rows r..r+3 of a
# column are 8-aligned (DST + 2r a multiple of 8 and RS_DST a multiple of
# 8), a block of four rows x one group is summed row by row (4 x (P loads,
# P - 1 f16v4add), the same order and roundings as one row at a time) and
# transposed in registers with eight packs, and each of its four columns
# is one st64: per block 4P loads and 4 stores in the main slot against
# 4P - 4 adds and 8 packs in the arithmetic slot, 4P + 4 bundles with no
# idle slot, P + 1 per group.
#
# Rows x, y, z, w = r, r+1, r+2, r+3 of a block; sums $a2:3 (x), $a4:5 (y),
# $a6:7 (z), $a8:9 (w); $a0:1 the partial just loaded. Column j of the
# block is the pair (L_j, H_j): L_j = (x_j, y_j) from pack16lo/pack16hi of
# the x and y words, H_j = (z_j, w_j) from those of z and w. The L words go
# to $a10 (L1), $a4 (L0, over y's low word once both packs have read it),
# $a12 (L2) and $a14 (L3), the H words to the odd register beside each, so
# that columns 0..3 are the aligned pairs $a4:5, $a10:11, $a12:13 and
# $a14:15 and no move is needed. The registers are exactly enough: while a
# block's H packs wait for its w sum, it holds its four columns' L words
# (in four pairs, the odd halves kept for the H words) and its z and w
# sums, the partial pair is in use, and the one pair left is x's, which the
# L packs have already read, so the next block's x row can start at once.
#
# An arithmetic slot is free after each partial-0 load and each store (no
# add is due there). The L packs of a block use the free slots after y's
# sum is final; its H packs and stores run during the next block's x and y
# rows (columns 0 and 1) and z and w rows (columns 2 and 3), each store
# after the pack that completes its pair and before the pack that writes
# that pair next (a store and a pack in one bundle: the store reads first):
#
#   main:  x p0  x p1  st c0  st c1  x p2 ..  y p0  y p1 ..  z p0  z p1  st c2 ..  w p0  st c3  w p1 ..
#   arith: w+=p  H0    H1     x+=p1  H2   ..  x+=p  H3   ..  y+=p  L1    L0    ..  z+=p  L2     L3   ..
#
# (P = 2 moves H2 beside y p0; P = 1 has no adds.) The groups of a block
# row run in a hardware loop. Its body starts at the w row's last partial
# load and ends before the next group's, so that one body finishes a group
# (that load, its final add, H packs and four stores) and starts the next:
# then the two steps that differ at a block row's end, that last partial
# load's (to the next block row's first partial) and the column-3 store's
# (to column 0 of rows r + 4..r + 7), fall in the same body, which is
# peeled out of the loop for a block row's last group. Every block row
# costs QUADS (4P + 4) + 2 bundles (rpt and brnzdec). Nothing is read that
# is not a partial of the block, nothing written that is not one of its 16
# result elements.
#
# A vertex's rows: the head rows before the first row whose 8 bytes are
# 8-aligned (h = ((-DST) mod 8) / 2 of them) and the (ROWS - h) mod 4
# rows after the last block go through the one-row path, which then
# continues at $m14 (the blocks after head rows; an exit after the rest). If RS_DST is not a multiple of 8 or fewer than h + 4 rows exist,
# every row takes the one-row path. P > 8 keeps the generic one-row loop.
#
# Registers beyond the one-row path's: $m5 = RS_SRC - (P-1) SECTION (a
# row's last partial to the next row's partial 0); $m13 = 8 - 3 RS_SRC -
# (P-1) SECTION (a block's w row, last partial, to its x row, next group,
# partial 0); $m1 (as in the one-row path) from the w row's last partial
# of a block row's last group to the next block row; $m9 block rows left;
# $m11 = ROWS - h until the prologue, then 8 - (4 QUADS - 1) RS_DST (column
# 4 QUADS - 1 to column 0, four rows on); $m4 the rows after the blocks;
# $m14 unused until the drain sets it to the exit for those rows.

# \n loads of further partials of a row into $a0:1 stepping by SECTION,
# then (\last = 1) one stepping to the next row by $m5, each beside the
# add of the partial loaded before it into \sum.
        .macro TR4_ADDS sum, w, n, last
        .rept \n
        { ld64 $a0:1, [\w]+=$m8 ; f16v4add \sum, \sum, $a0:1 }
        .endr
        .if \last
        { ld64 $a0:1, [\w]+=$m5 ; f16v4add \sum, \sum, $a0:1 }
        .endif
        .endm

# One loop body (4P + 4 bundles): the w row's last partial load of group g
# (stepping by \wstep), group g + 1's rows x, y, z, w up to that row's
# partial P - 2, group g's H packs and stores (column 3 stepping by
# \cstep), group g + 1's L packs. \w is the partial walk.
        .macro TR4_BODY P, w, wstep, cstep, e
        .if \P == 1
        { ld64 $a8:9, [\w]+=\wstep ; pack16hi $a14, $a3, $a5 }
        { ld64 $a2:3, [\w]+=$m5 ; pack16lo $a5, $a6, $a8 }
        { st64 $a4:5, [$m3]+=$m12 ; pack16hi $a11, $a6, $a8 }
        { st64 $a10:11, [$m3]+=$m12 ; pack16lo $a13, $a7, $a9 }
        { ld64 $a4:5, [\w]+=$m5 ; pack16hi $a15, $a7, $a9 }
        { ld64 $a6:7, [\w]+=$m5 ; pack16hi $a10, $a2, $a4 }
        { st64 $a12:13, [$m3]+=$m12 ; pack16lo $a4, $a2, $a4 }
        { st64 $a14:15, [$m3]+=\cstep ; pack16lo $a12, $a3, $a5 }
        .elseif \P == 2
        { ld64 $a0:1, [\w]+=\wstep ; pack16hi $a14, $a3, $a5 }
        { ld64 $a2:3, [\w]+=\e ; f16v4add $a8:9, $a8:9, $a0:1 }
        { ld64 $a0:1, [\w]+=$m5 ; pack16lo $a5, $a6, $a8 }
        { st64 $a4:5, [$m3]+=$m12 ; pack16hi $a11, $a6, $a8 }
        { st64 $a10:11, [$m3]+=$m12 ; f16v4add $a2:3, $a2:3, $a0:1 }
        { ld64 $a4:5, [\w]+=\e ; pack16lo $a13, $a7, $a9 }
        { ld64 $a0:1, [\w]+=$m5 ; pack16hi $a15, $a7, $a9 }
        { ld64 $a6:7, [\w]+=\e ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a0:1, [\w]+=$m5 ; pack16hi $a10, $a2, $a4 }
        { st64 $a12:13, [$m3]+=$m12 ; pack16lo $a4, $a2, $a4 }
        { ld64 $a8:9, [\w]+=\e ; f16v4add $a6:7, $a6:7, $a0:1 }
        { st64 $a14:15, [$m3]+=\cstep ; pack16lo $a12, $a3, $a5 }
        .else
        # Group g's w row: its last partial, its final add beside x's
        # partial 0 of group g + 1; then x's partials with group g's H0, H1
        # (columns 0 and 1 complete and stored), H2.
        { ld64 $a0:1, [\w]+=\wstep ; f16v4add $a8:9, $a8:9, $a0:1 }
        { ld64 $a2:3, [\w]+=\e ; f16v4add $a8:9, $a8:9, $a0:1 }
        { ld64 $a0:1, [\w]+=$m8 ; pack16lo $a5, $a6, $a8 }
        { st64 $a4:5, [$m3]+=$m12 ; pack16hi $a11, $a6, $a8 }
        { st64 $a10:11, [$m3]+=$m12 ; f16v4add $a2:3, $a2:3, $a0:1 }
        .if \P == 3
        { ld64 $a0:1, [\w]+=$m5 ; pack16lo $a13, $a7, $a9 }
        .else
        { ld64 $a0:1, [\w]+=$m8 ; pack16lo $a13, $a7, $a9 }
        TR4_ADDS $a2:3, \w, \P - 4, 1
        .endif
        # y's partials, H3 (group g's z and w sums are free after it).
        { ld64 $a4:5, [\w]+=\e ; f16v4add $a2:3, $a2:3, $a0:1 }
        { ld64 $a0:1, [\w]+=$m8 ; pack16hi $a15, $a7, $a9 }
        TR4_ADDS $a4:5, \w, \P - 3, 1
        # z's partials; y's sum is final: L1, then L0 over y's low word
        # beside the store of group g's column 2.
        { ld64 $a6:7, [\w]+=\e ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a0:1, [\w]+=$m8 ; pack16hi $a10, $a2, $a4 }
        { st64 $a12:13, [$m3]+=$m12 ; pack16lo $a4, $a2, $a4 }
        TR4_ADDS $a6:7, \w, \P - 3, 1
        # w's partials up to P - 2; group g's column 3 stored before L3
        # overwrites its low word.
        { ld64 $a8:9, [\w]+=\e ; f16v4add $a6:7, $a6:7, $a0:1 }
        { st64 $a14:15, [$m3]+=\cstep ; pack16lo $a12, $a3, $a5 }
        { ld64 $a0:1, [\w]+=$m8 ; pack16hi $a14, $a3, $a5 }
        TR4_ADDS $a8:9, \w, \P - 3, 0
        .endif
        .endm

# The first group of a vertex's blocks, entered with its x row's partial
# 0 in $a2:3, up to the start of a loop body: the body without the
# previous group's H packs and stores, whose main slots set $m4 (the rows
# after the blocks) and $m11 (the column-3 step of a block row's end).
        .macro TR4_PROLOGUE P, w, e
        .if \P == 1
        ld64 $a4:5, [\w]+=$m5
        { ld64 $a6:7, [\w]+=$m5 ; pack16hi $a10, $a2, $a4 }
        { and $m4, $m11, 3 ; pack16lo $a4, $a2, $a4 }
        { add $m11, $m7, 6 ; pack16lo $a12, $a3, $a5 }
        .elseif \P == 2
        ld64 $a0:1, [\w]+=$m5
        { ld64 $a4:5, [\w]+=\e ; f16v4add $a2:3, $a2:3, $a0:1 }
        ld64 $a0:1, [\w]+=$m5
        { ld64 $a6:7, [\w]+=\e ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a0:1, [\w]+=$m5 ; pack16hi $a10, $a2, $a4 }
        { ld64 $a8:9, [\w]+=\e ; f16v4add $a6:7, $a6:7, $a0:1 }
        { and $m4, $m11, 3 ; pack16lo $a4, $a2, $a4 }
        { add $m11, $m7, 6 ; pack16lo $a12, $a3, $a5 }
        .else
        ld64 $a0:1, [\w]+=$m8
        TR4_ADDS $a2:3, \w, \P - 3, 1
        { ld64 $a4:5, [\w]+=\e ; f16v4add $a2:3, $a2:3, $a0:1 }
        ld64 $a0:1, [\w]+=$m8
        TR4_ADDS $a4:5, \w, \P - 3, 1
        { ld64 $a6:7, [\w]+=\e ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a0:1, [\w]+=$m8 ; pack16hi $a10, $a2, $a4 }
        TR4_ADDS $a6:7, \w, \P - 3, 1
        { ld64 $a8:9, [\w]+=\e ; f16v4add $a6:7, $a6:7, $a0:1 }
        { and $m4, $m11, 3 ; pack16lo $a4, $a2, $a4 }
        { ld64 $a0:1, [\w]+=$m8 ; pack16lo $a12, $a3, $a5 }
        { add $m11, $m7, 6 ; pack16hi $a14, $a3, $a5 }
        TR4_ADDS $a8:9, \w, \P - 3, 0
        .endif
        .endm

# The last group's four column stores beside its H packs H1..H3 (H0 is
# done), the last store stepping to column 0 of the row after the blocks.
        .macro TR4_DRAIN_STORES
        { st64 $a4:5, [$m3]+=$m12 ; pack16hi $a11, $a6, $a8 }
        { st64 $a10:11, [$m3]+=$m12 ; pack16lo $a13, $a7, $a9 }
        { st64 $a12:13, [$m3]+=$m12 ; pack16hi $a15, $a7, $a9 }
        st64 $a14:15, [$m3]+=$m11
        .endm

# The last group: its w row's last partial load (stepping to the row after
# the blocks), the final add, the H packs and the four stores (the last to
# column 0 of the row after the blocks); $m14 = the exit, for the rows
# after the blocks.
        .macro TR4_DRAIN P, w
        .if \P == 1
        { ld64 $a8:9, [\w]+=$m1 ; pack16hi $a14, $a3, $a5 }
        { setzi $m14, acc16_tr_exit ; pack16lo $a5, $a6, $a8 }
        .else
        .if \P == 2
        { ld64 $a0:1, [\w]+=$m1 ; pack16hi $a14, $a3, $a5 }
        .else
        { ld64 $a0:1, [\w]+=$m1 ; f16v4add $a8:9, $a8:9, $a0:1 }
        .endif
        { setzi $m14, acc16_tr_exit ; f16v4add $a8:9, $a8:9, $a0:1 }
        pack16lo $a5, $a6, $a8
        .endif
        TR4_DRAIN_STORES
        .endm

# The blocks of one P ($m2 walks the partials, P = 1: $m6). Entered at
# acc16_tr_fast_P after head rows ($m11 = ROWS - h, $m2 at the first
# block's partial 0) or at acc16_tr_pre_P from row 0 (partial 0 read
# into $a2:3, $m9 = B = (ROWS - h) / 4 too). The prologue's brnzdec counts
# the first block row; the rows after the blocks continue on the one-row
# path, which exits through $m14.
        .macro TR4_ROWS P
        .if \P == 1
        TR4_ROWS_W \P, $m6, $m8
        .elseif OWN == 1
        TR4_ROWS_W \P, $m2, $m6
        .else
        TR4_ROWS_W \P, $m2, $m8
        .endif
        .endm

        .macro TR4_ROWS_W P, w, e
acc16_tr_row_\P:
        TR4_BODY \P, \w, $m1, $m11, \e
acc16_tr_first_\P:
        rpt $m10, 4 * \P + 4
        TR4_BODY \P, \w, $m13, $m12, \e
        brnzdec $m9, acc16_tr_row_\P
        TR4_DRAIN \P, \w
        brnzdec $m4, acc16_tr_tail_\P
        exit
acc16_tr_tail_\P:
        .if \P > 1
        ld64 $a2:3, [$m2]+=\e
        .endif
        br acc16_first_\P
acc16_tr_fast_\P:
        shr $m9, $m11, 2
        .if \P == 1
        # P = 1: x's partial 0 is its last; the walk steps to row y.
        ld64 $a2:3, [\w]+=$m5
        .else
        ld64 $a2:3, [\w]+=\e
        .endif
acc16_tr_pre_\P:
        TR4_PROLOGUE \P, \w, \e
        brnzdec $m9, acc16_tr_first_\P
        .endm

# \h = ((-DST) mod 8) / 2, the rows before the first 8-aligned one ($m3 =
# DST), and a branch to \fail unless h + 4 <= ROWS ($m4 = ROWS - 1);
# \t is a temporary.
        .macro TR_HEAD_ROWS h, t, fail
        sub \h, $mzero, $m3
        and \h, \h, 6
        shr \h, \h, 1
        add \t, \h, 2
        cmpult \t, \t, $m4
        brz \t, \fail
        .endm

# TR=1 dispatch, after the one-row path's setup (partial 0 of row 0 in
# $a2:3; $m9 = P, $m11 = RS_SRC, $m13 = (P-1) SECTION, $m4 = ROWS - 1).
# P > 8: the generic one-row loop for every row. Otherwise $m9 = the
# one-row entry of P in acc16_table. The blocks need RS_DST a multiple of
# 8 (tested first, so that other layouts lose little to the dispatch) and
# h + 4 <= ROWS, h the rows before the first 8-aligned one; else every row
# takes the one-row path and exits. With blocks: from row 0 (h = 0)
# straight into them (acc16_table + 72 + 4P - 4), or first the h head rows,
# continuing at acc16_table + 36 + 4P - 4.
        .macro ACC16_TR_DISPATCH
        cmpult $m14, $m9, ACC16_UNROLLED + 1
        brz $m14, acc16_generic
        shl $m9, $m9, 2
        setzi $m14, acc16_table - 4
        add $m9, $m9, $m14
        and $m14, $m12, 7
        brnz $m14, acc16_tr_rows
        sub $m5, $m11, $m13
        mul $m13, $m11, 3
        sub $m13, $m0, $m13
        TR_HEAD_ROWS $m14, $m11, acc16_tr_rows
        sub $m11, $m4, $m14
        add $m11, $m11, 1
        brz $m14, acc16_tr_aligned
        add $m4, $m14, -1
        add $m14, $m9, 36
        br $m9
acc16_tr_aligned:
        add $m14, $m9, 72
        shr $m9, $m11, 2
        br $m14
acc16_tr_rows:
        setzi $m14, acc16_tr_exit
        br $m9
        .endm

        .if EPI == 0
        .text
        .globl reduce_f32
        .entry reduce_f32
reduce_f32:
        ld32 $m2, [$m0 + ST_SRC]
        ld32 $m8, [$m0 + ST_SECTION]
        ld32 $m9, [$m0 + ST_P]
        ld32 $m11, [$m0 + ST_RS_SRC]
        ld32 $m3, [$m0 + ST_DST]
        ld32 $m12, [$m0 + ST_RS_DST]
        ld32 $m4, [$m0 + ST_ROWS]
        ld32 $m10, [$m0 + ST_QUADS]
        add $m4, $m4, -1
        add $m10, $m10, -1
        # $m13 = (P-1) SECTION, $m5 = 8 (QUADS-1).
        add $m13, $m9, -1
        mul $m13, $m13, $m8
        shl $m5, $m10, 3
        .if OWN == 1
        # OWN (TR=1): partial 0 of every row at OWN + row * RS_SRC instead
        # of SRC + row * RS_SRC. D = OWN - SRC (0 when OWN is 0) moves the
        # walk's start, and every step that arrives at a partial 0 (from
        # partial P-1: G and the row steps, which all subtract (P-1)
        # SECTION) gains D: $m13 = (P-1) SECTION - D. The step that leaves
        # a partial 0 for partial 1 is E = SECTION - D ($m6, kept from
        # here; P = 1 walks $m6 from SRC instead, chosen below). All of it
        # branch-free, so that both kinds of vertex cost the same. A vertex
        # given OWN with P outside 2..8 faults (a load from address 0):
        # P = 1 has nothing to gather, and the generic loop for P > 8 steps
        # its partials without E. $m1 is free until the set-up below.
        ld32 $m6, [$m0 + ST_OWN]
        OWN_SHIFT $m6, $m1
        add $m14, $m9, -2
        cmpult $m14, $m14, 7
        xor $m14, $m14, 1
        and $m14, $m14, $m1
        add $m14, $m14, -1
        and $m14, $m14, $m2
        ld32 $m14, [$m14 + 0]
        add $m2, $m2, $m6
        sub $m13, $m13, $m6
        sub $m6, $m8, $m6
        .endif
        .if PAIRS == 0
        sub $m0, $mzero, $m13
        add $m0, $m0, 8
        sub $m1, $m11, $m5
        sub $m1, $m1, $m13
        .endif
        .if TR == 1
        TR_ROW_STEP
        .else
        sub $m7, $m12, $m5
        .if PAIRS == 1
        # Two partials per load (acc16f_*, after the generic loop) when the
        # memory allows ld2x64st64 and its 16-bit strides: $m14 collects
        # a nonzero value for each condition that fails, $m13 = lo = RS_SRC
        # - 8 (QUADS-1) (the partial walk's step from a row's last group to
        # the next row's first) for that path. The conditions: P <= 8; SRC
        # in region 1 (0x80000 <= SRC < 0x100000; beyond 0xE8000 every
        # path faults); SECTION = 8 mod 16 (partials i and i + 1 in
        # different banks, so that one ld2x64st64 may load both even from
        # one element) and below 0x80000 (so that every partial lies at or
        # after SRC, in region 1); lo and hi = RS_DST - 8 (QUADS-1) in
        # 0..0x7FFF (the signed halves of the stride register); the
        # vertex's last result group below 0x80000, so that every store is
        # in region 0 and never in an element that a load of the same
        # instruction reads. Otherwise the code below runs as it did
        # before that path existed.
        add $m14, $m9, -1
        shr $m14, $m14, 3
        # OWN (when not 0) in region 1 and in the bank partial 0 would
        # have at SRC (OWN = SRC mod 16), so that partials 0 and 1 never
        # share a bank of one element. $m0 stays the state pointer until
        # the set-up ($m13 is free here: lo replaces it below).
        # Branch-free, so that OWN = 0 and OWN != 0 cost the same and one
        # formula describes both ($m1 is free until the set-up).
        ld32 $m6, [$m0 + ST_OWN]
        xor $m13, $m6, $m2
        and $m13, $m13, 15
        shr $m1, $m6, 19
        xor $m1, $m1, 1
        or $m13, $m13, $m1
        cmpne $m1, $m6, $mzero
        sub $m1, $mzero, $m1
        and $m13, $m13, $m1
        or $m14, $m14, $m13
        and $m6, $m8, 15
        xor $m6, $m6, 8
        or $m14, $m14, $m6
        shr $m6, $m8, 19
        or $m14, $m14, $m6
        shr $m6, $m2, 19
        xor $m6, $m6, 1
        or $m14, $m14, $m6
        sub $m13, $m11, $m5
        shr $m6, $m13, 15
        or $m14, $m14, $m6
        shr $m6, $m7, 15
        or $m14, $m14, $m6
        mul $m6, $m4, $m12
        add $m6, $m6, $m3
        add $m6, $m6, $m5
        shr $m6, $m6, 19
        or $m14, $m14, $m6
        brz $m14, acc16f_setup
        # The one-load path reads partial 0 at SRC: a vertex given OWN
        # where the two-partial path cannot run faults here (a load from
        # address 0, outside tile memory) rather than sum the wrong
        # partial. Then G and $m1 as the entry computes them for PAIRS=0.
        ld32 $m6, [$m0 + ST_OWN]
        brz $m6, acc16f_one_load
        ld32 $m6, [$mzero + 0]
acc16f_one_load:
        add $m13, $m9, -1
        mul $m13, $m13, $m8
        sub $m0, $mzero, $m13
        add $m0, $m0, 8
        sub $m1, $m11, $m5
        sub $m1, $m1, $m13
        .endif
        .endif
        .if OWN == 1
        # $m6: P = 1's walk ($m2, at SRC) for P = 1, else E.
        cmpeq $m14, $m9, 1
        sub $m5, $m2, $m6
        mul $m5, $m5, $m14
        add $m6, $m6, $m5
        .else
        mov $m6, $m2
        .endif
        # The first row's partial 0 (P = 1 walks $m6 instead), then the
        # branch to the rows of this P.
        .if OWN == 1
        ld64 $a2:3, [$m2]+=$m6
        .else
        ld64 $a2:3, [$m2]+=$m8
        .endif
        .if TR == 1
        ACC16_TR_DISPATCH
        .else
        min $m13, $m9, ACC16_UNROLLED + 1
        shl $m13, $m13, 2
        setzi $m5, acc16_table - 4
        add $m13, $m13, $m5
        br $m13
        .endif
acc16_table:
        br acc16_first_1
        br acc16_first_2
        br acc16_first_3
        br acc16_first_4
        br acc16_first_5
        br acc16_first_6
        br acc16_first_7
        br acc16_first_8
        br acc16_generic
        .if TR == 1
        # acc16_table + 36: the four-row path of P after head rows (B not
        # yet computed, partial 0 not read); + 72: the four-row path of P
        # from row 0 (partial 0 in $a2:3, B in $m9; P = 1 walks $m6 and
        # reads its partial 0 itself). The last entries are never taken
        # (P > 8 runs the generic one-row loop).
acc16_tr_fast_table:
        br acc16_tr_fast_1
        br acc16_tr_fast_2
        br acc16_tr_fast_3
        br acc16_tr_fast_4
        br acc16_tr_fast_5
        br acc16_tr_fast_6
        br acc16_tr_fast_7
        br acc16_tr_fast_8
        br acc16_generic
acc16_tr_pre_table:
        br acc16_tr_fast_1
        br acc16_tr_pre_2
        br acc16_tr_pre_3
        br acc16_tr_pre_4
        br acc16_tr_pre_5
        br acc16_tr_pre_6
        br acc16_tr_pre_7
        br acc16_tr_pre_8
        br acc16_generic
        # The dispatch adds these distances to an acc16_table entry.
        .if acc16_tr_fast_table - acc16_table != 36 || acc16_tr_pre_table - acc16_table != 72
        .error "the TR=1 branch tables must follow acc16_table at +36 and +72"
        .endif
        .endif

        ACC16_UNROLLED_ROWS 1
        ACC16_UNROLLED_ROWS 2
        ACC16_UNROLLED_ROWS 3
        ACC16_UNROLLED_ROWS 4
        ACC16_UNROLLED_ROWS 5
        ACC16_UNROLLED_ROWS 6
        ACC16_UNROLLED_ROWS 7
        ACC16_UNROLLED_ROWS 8

        .if TR == 1
        TR4_ROWS 1
        TR4_ROWS 2
        TR4_ROWS 3
        TR4_ROWS 4
        TR4_ROWS 5
        TR4_ROWS 6
        TR4_ROWS 7
        TR4_ROWS 8
acc16_tr_exit:
        exit
        .endif

# P > ACC16_UNROLLED: one group per iteration of a brnzdec loop, partials
# 3..P-2 in a one-bundle hardware loop; the read-ahead of the next group's
# partial 0 runs on past a row's last group (into that row's stride or
# the next partial, never past the partials), and the row's end steps the
# walks: $m13 = P - 4, $m14 = RS_SRC - 8 QUADS - SECTION, $m7 = from the
# column (TR=1) or group after a row's last to the next row's first.
acc16_generic:
        add $m13, $m9, -4
        shl $m14, $m10, 3
        add $m14, $m14, 8
        sub $m14, $m11, $m14
        sub $m14, $m14, $m8
        .if TR == 1
        sub $m7, $m7, $m12
        .else
        add $m7, $m7, -8
        .endif
        br acc16_generic_first
acc16_generic_row:
        ld64 $a2:3, [$m2]+=$m8
acc16_generic_first:
        mov $m5, $m10
acc16_generic_quad:
        ld64 $a0:1, [$m2]+=$m8
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add $a4:5, $a2:3, $a0:1 }
        rpt $m13, 1
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a0:1, [$m2]+=$m0 ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a2:3, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        .if TR == 1
        ACC16_STORE $a4:5, $a4, $a5, $m12
        .else
        ACC16_STORE $a4:5, $a4, $a5, 8
        .endif
        brnzdec $m5, acc16_generic_quad
        add $m2, $m2, $m14
        add $m3, $m3, $m7
        brnzdec $m4, acc16_generic_row
        exit

        .if TR == 0 && PAIRS == 1
# ACC=16 TR=0 EPI=0, two partials per load. The one-load path above is
# bound by its main slot: per group of four results P ld64 and one st64
# (P + 1 bundles) against P - 1 adds in the arithmetic slot. Here one
# ld2x64st64 per group loads partials 0 and 1 (SECTION apart, in
# different banks: SECTION = 8 mod 16) and stores the previous group's
# result, and ld64 loads partials 2..P-1: P - 1 main-slot instructions
# against P - 1 adds, so every bundle is full and a group costs P - 1
# bundles (P = 1: one ld64st64 per group, a copy). The sums are those of
# the one-load path, bit for bit: s = p0 + p1, then s = f16(s + p) for
# p2, ..., p(P-1) in partial order, each add rounded once (f16v4add).
#
# The pointers of ld2x64st64 step only by its pace codes (+8, the signed
# low or high half of the stride register, or nothing), and 2 SECTION
# seldom fits 16 bits, so partials 0 and 1 each have their own walk
# ($m1, $m2, +8 per group) and the result walk $m3 is the instruction's
# third pointer; partials 2..P-1 go through the ld64 walk $m6 as in the
# one-load path (32-bit steps in registers). The stride register $m7
# holds lo = RS_SRC - 8 (QUADS-1) (from a row's last group to the next
# row's first, for $m1 and $m2) in its low half and hi = RS_DST - 8
# (QUADS-1) (the same for the results, $m3) in its high half.
#
# Schedule of group g (P >= 4; bundle j = 0 .. P-2):
#   j = 0:          ld2x64st64: partials 0, 1 of group g + 1, store the
#                   result of group g - 1   |  s = p0 + p1 (group g)
#   j = 1 .. P-3:   ld64 partial j + 2 of group g  |  s += partial j + 1
#   j = P-2:        ld64 partial 2 of group g + 1  |  s += partial P - 1
# Bundle 0's add reads the quad $a0:3 before the load of the same bundle
# replaces it, and its store reads $a4:5 (the finished sum of group g - 1)
# before the add replaces it. P = 3 has no middle bundles; P = 2 is bundle
# 0 alone.
#
# Row ends. Loads run one group ahead and stores one group behind, so the
# steps that differ at the end of a row fall in three groups: the one
# that loads partials 0 and 1 of a row's last group (group QUADS-2: $m1,
# $m2 step by lo), the one that loads the last partial of a row's last
# group (group QUADS-1, P >= 4: $m6 steps by Rc = lo - (P-3) SECTION to
# partial 2 of the next row; for P = 3 this falls in group QUADS-2 too),
# and the one that stores a row's last result (group 0 of the next row:
# $m3 steps by hi). Every other step is +8 ($m1..$m3) or G = 8 - (P-3)
# SECTION ($m6, from partial P-1 of a group to partial 2 of the next).
# With QUADS >= 3 a row runs as its group 0, the middle groups in a
# hardware loop, group QUADS-2, a brnzdec, and (at the top of the next
# row) group QUADS-1: QUADS (P - 1) + 2 bundles per row. With QUADS = 2
# or 1 every row is the same sequence of groups, so a hardware loop runs
# the rows: QUADS (P - 1) bundles per row.
#
# The ends of a vertex. A prologue loads partials 0..2 of the first
# group; its ld2x64st64 and that of the first group store (with pace "no
# increment") whatever $a4:5 holds to result group 0, which the real
# result of group 0 overwrites one group later. The last group loads
# nothing of a next group: its first bundle stores the result before it
# with st64, and a final st64 stores its own. So nothing is read that is
# not a partial of the vertex, and nothing is written outside its ROWS x
# 4 QUADS results.
#
# Registers: $a0:3 partials 0 and 1, $a6:7 the partial just loaded by
# ld64, $a4:5 the sum; $m0 = G; $m1, $m2 the walks of partials 0 and 1
# (P = 1: $m2 the walk of the only partial); $m3 the result walk; $m4
# rows left (QUADS = 1: minus one more); $m6 the walk of partials 2..P-1;
# $m7 the stride register (hi << 16 | lo); $m8 SECTION; $m10 QUADS - 3
# (the middle groups); $m11 = Rc; $m12 RS_DST (= hi when QUADS = 1); $m13
# lo.

# One group of P >= 2 partials (P - 1 bundles). \ab, \s: the pace of its
# ld2x64st64; \crow = 1: $m6 steps to the next row after this group's last
# partial (P = 3: after the next group's partial 2); \kind 0: a group
# followed by another (loads partials 0..2 of the next group), 1: the
# vertex's last group (stores the result before it with st64, \s = 2
# stepping by $m12, and loads nothing of a next group), 2: the vertex's
# only group (stores nothing, loads nothing more).
        .macro ACC16F_GROUP P, ab, s, crow, kind
        .if \kind == 0
        { ld2x64st64 $a0:3, $a4:5, $m1, $m7, 5 * (\ab) + 16 * (\s) ; f16v4add $a4:5, $a0:1, $a2:3 }
        .elseif \kind == 1 && \s == 2
        { st64 $a4:5, [$m3]+=$m12 ; f16v4add $a4:5, $a0:1, $a2:3 }
        .elseif \kind == 1
        { st64 $a4:5, [$m3]+=8 ; f16v4add $a4:5, $a0:1, $a2:3 }
        .else
        f16v4add $a4:5, $a0:1, $a2:3
        .endif
        .if \P >= 4
        .rept \P - 4
        { ld64 $a6:7, [$m6]+=$m8 ; f16v4add $a4:5, $a4:5, $a6:7 }
        .endr
        .if \crow
        { ld64 $a6:7, [$m6]+=$m11 ; f16v4add $a4:5, $a4:5, $a6:7 }
        .else
        { ld64 $a6:7, [$m6]+=$m0 ; f16v4add $a4:5, $a4:5, $a6:7 }
        .endif
        .endif
        .if \P >= 3
        .if \kind != 0
        f16v4add $a4:5, $a4:5, $a6:7
        .elseif \P >= 4
        { ld64 $a6:7, [$m6]+=$m8 ; f16v4add $a4:5, $a4:5, $a6:7 }
        .elseif \crow
        { ld64 $a6:7, [$m6]+=$m11 ; f16v4add $a4:5, $a4:5, $a6:7 }
        .else
        { ld64 $a6:7, [$m6]+=8 ; f16v4add $a4:5, $a4:5, $a6:7 }
        .endif
        .endif
        .endm

# Partials 0..2 of the first group; \ab = 1 when it is its row's last
# (QUADS = 1). The store goes to result group 0 and stays there.
        .macro ACC16F_PROLOGUE P, ab
        ld2x64st64 $a0:3, $a4:5, $m1, $m7, 5 * (\ab) + 48
        .if \P >= 4
        ld64 $a6:7, [$m6]+=$m8
        .elseif \P == 3 && \ab
        ld64 $a6:7, [$m6]+=$m11
        .elseif \P == 3
        ld64 $a6:7, [$m6]+=8
        .endif
        .endm

# The vertex for P >= 2 partials, for each class of QUADS.
        .macro ACC16F_ROWS P
        # QUADS >= 3. Group 0 of row 0 stores nothing real; the loop
        # starts at the middle groups.
acc16f_q3_\P:
        ACC16F_PROLOGUE \P, 0
        ACC16F_GROUP \P, 0, 3, 0, 0
        br acc16f_mid_\P
acc16f_row_\P:
        # Group QUADS-1 of the row before, group 0 of this row.
        ACC16F_GROUP \P, 0, 0, \P >= 4, 0
        ACC16F_GROUP \P, 0, 2, 0, 0
acc16f_mid_\P:
        rpt $m10, \P - 1
        ACC16F_GROUP \P, 0, 0, 0, 0
        ACC16F_GROUP \P, 1, 0, \P == 3, 0
        brnzdec $m4, acc16f_row_\P
        ACC16F_GROUP \P, 0, 0, 0, 1
        st64 $a4:5, [$m3]
        exit
        # QUADS = 2: group 0 then, per further row, group 1 of the row
        # before and group 0 of this row.
acc16f_q2_\P:
        ACC16F_PROLOGUE \P, 0
        ACC16F_GROUP \P, 1, 3, \P == 3, 0
        rpt $m4, 2 * (\P - 1)
        ACC16F_GROUP \P, 0, 0, \P >= 4, 0
        ACC16F_GROUP \P, 1, 2, \P == 3, 0
        ACC16F_GROUP \P, 0, 0, 0, 1
        st64 $a4:5, [$m3]
        exit
        # QUADS = 1: every group is its row's last.
acc16f_q1_\P:
        ACC16F_PROLOGUE \P, 1
        brz $m4, acc16f_single_\P
        add $m4, $m4, -1
        ACC16F_GROUP \P, 1, 3, 1, 0
        rpt $m4, \P - 1
        ACC16F_GROUP \P, 1, 2, 1, 0
        ACC16F_GROUP \P, 0, 2, 0, 1
        st64 $a4:5, [$m3]
        exit
acc16f_single_\P:
        ACC16F_GROUP \P, 0, 3, 0, 2
        st64 $a4:5, [$m3]
        exit
        .endm

# Set-up after the checks at the entry: the stride register, G, Rc, the
# walks, QUADS - 3, then a branch through acc16f_table to the code of
# (QUADS class, P).
acc16f_setup:
        # OWN, then G = 8 - (P-1) SECTION and $m1 = lo - (P-1) SECTION as
        # the entry computes them for PAIRS=0 ($m0 is the state pointer
        # until here).
        ld32 $m14, [$m0 + ST_OWN]
        add $m6, $m9, -1
        mul $m6, $m6, $m8
        sub $m0, $mzero, $m6
        add $m0, $m0, 8
        sub $m1, $m13, $m6
        shl $m6, $m7, 16
        or $m7, $m6, $m13
        add $m5, $m8, $m8
        add $m0, $m0, $m5
        add $m11, $m1, $m5
        add $m6, $m2, $m5
        # Partial 0's walk: OWN when given, else SRC, without a branch
        # (partial 1 is at SRC + SECTION either way, partials 2.. from SRC
        # + 2 SECTION).
        OWN_SHIFT $m14, $m1
        add $m1, $m2, $m14
        add $m2, $m2, $m8
        min $m14, $m10, 2
        add $m10, $m10, -2
        shl $m14, $m14, 3
        add $m14, $m14, $m9
        shl $m14, $m14, 2
        setzi $m5, acc16f_table - 4
        add $m14, $m14, $m5
        br $m14
acc16f_table:
        br acc16f_q1_1
        br acc16f_q1_2
        br acc16f_q1_3
        br acc16f_q1_4
        br acc16f_q1_5
        br acc16f_q1_6
        br acc16f_q1_7
        br acc16f_q1_8
        br acc16f_q2_1
        br acc16f_q2_2
        br acc16f_q2_3
        br acc16f_q2_4
        br acc16f_q2_5
        br acc16f_q2_6
        br acc16f_q2_7
        br acc16f_q2_8
        br acc16f_q3_1
        br acc16f_q3_2
        br acc16f_q3_3
        br acc16f_q3_4
        br acc16f_q3_5
        br acc16f_q3_6
        br acc16f_q3_7
        br acc16f_q3_8

# P = 1: a copy, one ld64st64 per group (load group g + 1 into $a0:1,
# store group g from it; $m2 the walk, $m3 the results, $m7 the stride
# register: pace 1 steps $m2 by lo, 8 steps $m3 by hi). The set-up left
# $m1 at SRC.
acc16f_q3_1:
        ld64 $a0:1, [$m1]
        add $m2, $m1, 8
        br acc16f_mid_1
acc16f_row_1:
        # Group QUADS-1 of the row before: load group 0 of this row.
        ld64st64 $a0:1, $a0:1, $m2, $m7, 8
acc16f_mid_1:
        ld64st64 $a0:1, $a0:1, $m2, $m7, 0
        rpt $m10, 1
        ld64st64 $a0:1, $a0:1, $m2, $m7, 0
        # Group QUADS-2: load the row's last group.
        ld64st64 $a0:1, $a0:1, $m2, $m7, 1
        brnzdec $m4, acc16f_row_1
        st64 $a0:1, [$m3]
        exit
acc16f_q2_1:
        ld64 $a0:1, [$m1]
        add $m2, $m1, 8
        rpt $m4, 2
        ld64st64 $a0:1, $a0:1, $m2, $m7, 1
        ld64st64 $a0:1, $a0:1, $m2, $m7, 8
        ld64st64 $a0:1, $a0:1, $m2, $m7, 1
        st64 $a0:1, [$m3]
        exit
acc16f_q1_1:
        ld64 $a0:1, [$m1]
        add $m2, $m1, $m13
        rpt $m4, 1
        ld64st64 $a0:1, $a0:1, $m2, $m7, 9
        st64 $a0:1, [$m3]
        exit

        ACC16F_ROWS 2
        ACC16F_ROWS 3
        ACC16F_ROWS 4
        ACC16F_ROWS 5
        ACC16F_ROWS 6
        ACC16F_ROWS 7
        ACC16F_ROWS 8
        .endif
        .elseif EPI == 1
# ACC=16 EPI=1: y = f16(s + bias[col]) (f16v4add) on the f16 sum s above.
# The main slot is the bound (P loads, the bias load and the store of a
# group; the arithmetic slot has P - 1 adds and the bias add): P + 2
# bundles per group. The layout is that of EPI=0: partial 0 read ahead
# beside the bias add, a row's last group peeled so that its last partial
# load steps the walk to the next row's partial 0 and its bias load steps
# the bias walk back to column 0, its bias add and store run at the top of
# the next row beside that row's partial 0 load (or after the last row,
# which reads nothing past itself). P = 1 has no partial load to carry the
# row step: one add bundle more per row.
#
# $a2:3 partial 0 (read ahead), $a0:1 the partial just loaded, $a4:5 the
# sum then the result, $a6:7 the bias. $m0 = 8 - (P-1) SECTION; $m1 =
# RS_SRC - 8 (QUADS-1) - (P-1) SECTION; $m2 the partial walk ($m6 for P =
# 1); $m3 the result walk; $m4 rows left; $m5 = -8 (QUADS-1), from a
# row's last bias back to column 0; $m7 = RS_DST - 8 (QUADS-1); $m8
# SECTION; $m9 P; $m10 QUADS - 1; $m13 = RS_SRC - 8 QUADS (P = 1: from
# a row's end to the next row); $m14 the bias walk.

# The last add of a group beside its bias load (the bias walk stepped by
# \step).
        .macro ACC16_BIAS_LOAD_ADD P, step
        .if \P == 2
        { ld64 $a6:7, [$m14]+=\step ; f16v4add $a4:5, $a2:3, $a0:1 }
        .else
        { ld64 $a6:7, [$m14]+=\step ; f16v4add $a4:5, $a4:5, $a0:1 }
        .endif
        .endm

# TR=1 stores with ACC16_STORE, whose two pack16hi write $a6 and $a7: the
# bias pair, which every group's bias add has read by then and every
# group reloads before its next add.
        .macro ACC16_BIAS_ROWS P
        .if \P == 1
acc16b_row_1:
        { ld64 $a2:3, [$m6]+=$m0 ; f16v4add $a4:5, $a2:3, $a6:7 }
        ACC16_STORE $a4:5, $a4, $a5, $m7
acc16b_first_1:
        rpt $m10, 2 + ACC16_STORE_BUNDLES
        ld64 $a6:7, [$m14]+=8
        { ld64 $a2:3, [$m6]+=$m0 ; f16v4add $a4:5, $a2:3, $a6:7 }
        ACC16_STORE_NEXT
        ld64 $a6:7, [$m14]+=$m5
        add $m6, $m6, $m13
        brnzdec $m4, acc16b_row_1
        f16v4add $a4:5, $a2:3, $a6:7
        ACC16_STORE_NEXT
        exit
        .else
acc16b_row_\P:
        # The previous row's last group: bias add beside this row's
        # partial 0 load, then its store.
        { ld64 $a2:3, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a6:7 }
        ACC16_STORE $a4:5, $a4, $a5, $m7
acc16b_first_\P:
        rpt $m10, \P + 1 + ACC16_STORE_BUNDLES
        ACC16_LOADS \P, $m0
        ACC16_BIAS_LOAD_ADD \P, 8
        { ld64 $a2:3, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a6:7 }
        ACC16_STORE_NEXT
        ACC16_LOADS \P, $m1
        ACC16_BIAS_LOAD_ADD \P, $m5
        brnzdec $m4, acc16b_row_\P
        f16v4add $a4:5, $a4:5, $a6:7
        .if TR == 1
        # The rows may be only the head of the vertex's (before its first
        # 8-aligned row): the walk steps to column 0 of the next row and
        # the path continues at $m9 (the blocks, or an exit).
        ACC16_STORE $a4:5, $a4, $a5, $m7
        br $m9
        .else
        ACC16_STORE_NEXT
        exit
        .endif
        .endif
        .endm

        .if TR == 1
# ACC=16 EPI=1 TR=1, four rows at a time (2 <= P <= 8): the blocks of
# EPI=0 (above) with the bias as one more partial of every row. The bias
# add is f16v4add of the row's f16 sum and the bias quad, rounded once,
# exactly what the one-row path computes, so a row's bias load and add
# take the place of a partial P's: per block 4 (P + 1) loads and 4 stores
# in the main slot against 4P adds and 8 packs in the arithmetic slot,
# 4P + 8 bundles with no idle slot, P + 2 per group (the one-row path:
# P + 5). The schedule is that of EPI=0 for P + 1 partials, with each
# row's last load reading the bias and the load before it (the row's
# real last partial) stepping to the next row. No register is left for
# a bias pair kept across rows, so each of the four rows loads it.
#
# The loop body starts one bundle earlier than EPI=0's, at the w row's
# real last partial, so that the three steps that differ at a block
# row's end fall in the same body: that load's (\wstep: to the next
# group's x row, or to the next block row), the w row's bias load's
# (\bstep: the next group's bias, or back to column 0) and the column-3
# store's (\cstep).
#
# Registers as EPI=0's blocks except: $m14 the bias walk and $m5 =
# -8 (QUADS-1) (both as in the one-row path, which runs the head and tail
# rows with them unchanged); $m6 = RS_SRC - (P-1) SECTION, the step from
# a row's last partial to the next row's partial 0 (EPI=0's $m5); $m9
# block rows left, then where the one-row path continues (the exit).

# The loads of a row's partials after the first one (\n of them, the last
# stepping to the next row), each beside the add of the partial loaded
# before it, then the bias load beside the add of the last partial.
        .macro TR4B_ADDS sum, n
        .if \n > 0
        .rept \n - 1
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add \sum, \sum, $a0:1 }
        .endr
        { ld64 $a0:1, [$m2]+=$m6 ; f16v4add \sum, \sum, $a0:1 }
        .endif
        { ld64 $a0:1, [$m14] ; f16v4add \sum, \sum, $a0:1 }
        .endm

# One loop body (4P + 8 bundles): group g's w row from its real last
# partial (stepping by \wstep) and its bias (\bstep), its final adds, H
# packs and stores (column 3 stepping by \cstep); group g + 1's rows x, y,
# z and w up to w's partial P - 2 with its L packs. \s1: the step of a
# row's partial 1 load (to the next row when P = 2).
        .macro TR4B_BODY P, s1, wstep, bstep, cstep
        .if \P == 2
        { ld64 $a0:1, [$m2]+=\wstep ; pack16hi $a14, $a3, $a5 }
        .else
        { ld64 $a0:1, [$m2]+=\wstep ; f16v4add $a8:9, $a8:9, $a0:1 }
        .endif
        { ld64 $a0:1, [$m14]+=\bstep ; f16v4add $a8:9, $a8:9, $a0:1 }
        { ld64 $a2:3, [$m2]+=$m8 ; f16v4add $a8:9, $a8:9, $a0:1 }
        { ld64 $a0:1, [$m2]+=\s1 ; pack16lo $a5, $a6, $a8 }
        { st64 $a4:5, [$m3]+=$m12 ; pack16hi $a11, $a6, $a8 }
        { st64 $a10:11, [$m3]+=$m12 ; f16v4add $a2:3, $a2:3, $a0:1 }
        # x: partials 2..P-1 and the bias, H2 beside the first load.
        .if \P == 2
        { ld64 $a0:1, [$m14] ; pack16lo $a13, $a7, $a9 }
        .elseif \P == 3
        { ld64 $a0:1, [$m2]+=$m6 ; pack16lo $a13, $a7, $a9 }
        TR4B_ADDS $a2:3, 0
        .else
        { ld64 $a0:1, [$m2]+=$m8 ; pack16lo $a13, $a7, $a9 }
        TR4B_ADDS $a2:3, \P - 3
        .endif
        # y, H3 beside its partial 1.
        { ld64 $a4:5, [$m2]+=$m8 ; f16v4add $a2:3, $a2:3, $a0:1 }
        { ld64 $a0:1, [$m2]+=\s1 ; pack16hi $a15, $a7, $a9 }
        TR4B_ADDS $a4:5, \P - 2
        # z; y's sum is final: L1, then L0 beside the store of column 2.
        { ld64 $a6:7, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a0:1, [$m2]+=\s1 ; pack16hi $a10, $a2, $a4 }
        { st64 $a12:13, [$m3]+=$m12 ; pack16lo $a4, $a2, $a4 }
        TR4B_ADDS $a6:7, \P - 2
        # w up to partial P - 2; column 3 stored before L3 overwrites its
        # low word (P = 2: L3 at the next body's first bundle).
        { ld64 $a8:9, [$m2]+=$m8 ; f16v4add $a6:7, $a6:7, $a0:1 }
        { st64 $a14:15, [$m3]+=\cstep ; pack16lo $a12, $a3, $a5 }
        .if \P > 2
        { ld64 $a0:1, [$m2]+=$m8 ; pack16hi $a14, $a3, $a5 }
        .rept \P - 3
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add $a8:9, $a8:9, $a0:1 }
        .endr
        .endif
        .endm

# The first group of the blocks, entered with its x row's partial 0 in
# $a2:3, up to the start of a loop body; its free main slots set $m4 (the
# rows after the blocks) and $m11 (the column-3 step of a block row's
# end) from $m11 = the rows of the blocks and the tail.
        .macro TR4B_PROLOGUE P, s1
        ld64 $a0:1, [$m2]+=\s1
        TR4B_ADDS $a2:3, \P - 2
        { ld64 $a4:5, [$m2]+=$m8 ; f16v4add $a2:3, $a2:3, $a0:1 }
        ld64 $a0:1, [$m2]+=\s1
        TR4B_ADDS $a4:5, \P - 2
        { ld64 $a6:7, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a0:1, [$m2]+=\s1 ; pack16hi $a10, $a2, $a4 }
        TR4B_ADDS $a6:7, \P - 2
        { ld64 $a8:9, [$m2]+=$m8 ; f16v4add $a6:7, $a6:7, $a0:1 }
        { and $m4, $m11, 3 ; pack16lo $a4, $a2, $a4 }
        .if \P == 2
        { add $m11, $m7, 6 ; pack16lo $a12, $a3, $a5 }
        .else
        { ld64 $a0:1, [$m2]+=$m8 ; pack16lo $a12, $a3, $a5 }
        { add $m11, $m7, 6 ; pack16hi $a14, $a3, $a5 }
        .rept \P - 3
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add $a8:9, $a8:9, $a0:1 }
        .endr
        .endif
        .endm

# The last group: its w row's real last partial (stepping to the row
# after the blocks) and bias (back to column 0), the final adds, the H
# packs and the four stores (the last to column 0 of the row after the
# blocks); $m9 = the exit, for the rows after the blocks.
        .macro TR4B_DRAIN P
        .if \P == 2
        { ld64 $a0:1, [$m2]+=$m1 ; pack16hi $a14, $a3, $a5 }
        .else
        { ld64 $a0:1, [$m2]+=$m1 ; f16v4add $a8:9, $a8:9, $a0:1 }
        .endif
        { ld64 $a0:1, [$m14]+=$m5 ; f16v4add $a8:9, $a8:9, $a0:1 }
        { setzi $m9, acc16b_tr_exit ; f16v4add $a8:9, $a8:9, $a0:1 }
        pack16lo $a5, $a6, $a8
        TR4_DRAIN_STORES
        .endm

# The blocks of one P. Entered at acc16b_tr_fast_P with $m13 = the rows
# from the first block on (ROWS - h), $m6 as above, the partial walk at
# the first block's partial 0 and the bias walk at column 0; the rows
# after the blocks continue on the one-row path (acc16b_first_P), which
# exits through $m9.
        .macro TR4B_ROWS P
        .if \P == 2
        TR4B_ROWS_S \P, $m6
        .else
        TR4B_ROWS_S \P, $m8
        .endif
        .endm

        .macro TR4B_ROWS_S P, s1
acc16b_tr_row_\P:
        TR4B_BODY \P, \s1, $m1, $m5, $m11
acc16b_tr_first_\P:
        rpt $m10, 4 * \P + 8
        TR4B_BODY \P, \s1, $m13, 8, $m12
        brnzdec $m9, acc16b_tr_row_\P
        TR4B_DRAIN \P
        brnzdec $m4, acc16b_tr_tail_\P
        exit
acc16b_tr_tail_\P:
        ld64 $a2:3, [$m2]+=$m8
        br acc16b_first_\P
acc16b_tr_fast_\P:
        # $m13 = 8 - 3 RS_SRC - (P-1) SECTION (a block's w row, last
        # partial, to its x row, next group) = 4 $m0 - 3 $m6 - 24, since
        # $m0 = 8 - (P-1) SECTION and $m6 = RS_SRC - (P-1) SECTION.
        mov $m11, $m13
        mul $m13, $m6, 3
        shl $m9, $m0, 2
        sub $m13, $m9, $m13
        add $m13, $m13, -24
        shr $m9, $m11, 2
        ld64 $a2:3, [$m2]+=$m8
        TR4B_PROLOGUE \P, \s1
        brnzdec $m9, acc16b_tr_first_\P
        .endm

# TR=1 dispatch, after the one-row path's set-up (the entry of P in $m11,
# $m13 = RS_SRC - 8 QUADS, $m5 = -8 (QUADS-1), $m4 = ROWS - 1; partial 0
# not yet read). P = 1 and P > 8 keep the one-row path (and $m9 = P for
# the generic loop). The blocks need RS_DST a multiple of 8 and h + 4 <=
# ROWS, h = ((-DST) mod 8) / 2 the rows before the first 8-aligned one;
# else every row takes the one-row path, which then exits through $m9.
# With blocks: from row 0 (h = 0) straight into them at the entry of P
# in acc16b_tr_fast_table (acc16b_table + 36 + 4 (P - 2), that is the
# one-row entry + 32), or first the h head rows ($m4 = h - 1) on the
# one-row path, which continues there through $m9.
        .macro ACC16B_TR_DISPATCH
        add $m6, $m9, -2
        cmpult $m6, $m6, 7
        brz $m6, acc16b_tr_rows
        and $m6, $m12, 7
        brnz $m6, acc16b_tr_rows_exit
        sub $m6, $m13, $m5
        add $m6, $m6, $m0
        TR_HEAD_ROWS $m13, $m9, acc16b_tr_rows_exit
        sub $m4, $m4, $m13
        add $m9, $m11, 32
        brz $m13, acc16b_tr_aligned
        # $m4 = h - 1 and $m13 = ROWS - h from $m4 = ROWS - 1 - h, $m13 = h.
        add $m13, $m13, $m4
        sub $m4, $m13, $m4
        add $m4, $m4, -1
        sub $m13, $m13, $m4
        ld64 $a2:3, [$m2]+=$m8
        br $m11
acc16b_tr_aligned:
        add $m13, $m4, 1
        br $m9
acc16b_tr_rows_exit:
        setzi $m9, acc16b_tr_exit
acc16b_tr_rows:
        .endm
        .endif

        .text
        .globl reduce_f32
        .entry reduce_f32
reduce_f32:
        ld32 $m2, [$m0 + ST_SRC]
        ld32 $m8, [$m0 + ST_SECTION]
        ld32 $m9, [$m0 + ST_P]
        ld32 $m11, [$m0 + ST_RS_SRC]
        ld32 $m3, [$m0 + ST_DST]
        ld32 $m12, [$m0 + ST_RS_DST]
        ld32 $m4, [$m0 + ST_ROWS]
        ld32 $m10, [$m0 + ST_QUADS]
        ld32 $m14, [$m0 + ST_BIAS]
        add $m4, $m4, -1
        add $m10, $m10, -1
        # $m13 = (P-1) SECTION, $m5 = 8 (QUADS-1) until negated.
        add $m13, $m9, -1
        mul $m13, $m13, $m8
        shl $m5, $m10, 3
        sub $m0, $mzero, $m13
        add $m0, $m0, 8
        sub $m1, $m11, $m5
        sub $m1, $m1, $m13
        .if TR == 1
        TR_ROW_STEP
        .else
        sub $m7, $m12, $m5
        .endif
        sub $m13, $m11, $m5
        add $m13, $m13, -8
        sub $m5, $mzero, $m5
        # The table entry in $m11, through $m6 (so that TR=1 keeps RS_DST
        # in $m12), then $m6 = the walk of P = 1 from column 4.
        min $m11, $m9, ACC16_UNROLLED + 1
        shl $m11, $m11, 2
        setzi $m6, acc16b_table - 4
        add $m11, $m11, $m6
        .if TR == 1
        ACC16B_TR_DISPATCH
        .endif
        add $m6, $m2, 8
        # The first row's partial 0.
        ld64 $a2:3, [$m2]+=$m8
        br $m11
acc16b_table:
        br acc16b_first_1
        br acc16b_first_2
        br acc16b_first_3
        br acc16b_first_4
        br acc16b_first_5
        br acc16b_first_6
        br acc16b_first_7
        br acc16b_first_8
        br acc16e_generic
        .if TR == 1
        # acc16b_table + 36: the blocks of P = 2..8 (the dispatch adds 32
        # to the one-row entry of P).
acc16b_tr_fast_table:
        br acc16b_tr_fast_2
        br acc16b_tr_fast_3
        br acc16b_tr_fast_4
        br acc16b_tr_fast_5
        br acc16b_tr_fast_6
        br acc16b_tr_fast_7
        br acc16b_tr_fast_8
        .if acc16b_tr_fast_table - acc16b_table != 36
        .error "the TR=1 blocks' branch table must follow acc16b_table at +36"
        .endif
        .endif

        ACC16_BIAS_ROWS 1
        ACC16_BIAS_ROWS 2
        ACC16_BIAS_ROWS 3
        ACC16_BIAS_ROWS 4
        ACC16_BIAS_ROWS 5
        ACC16_BIAS_ROWS 6
        ACC16_BIAS_ROWS 7
        ACC16_BIAS_ROWS 8

        .if TR == 1
        TR4B_ROWS 2
        TR4B_ROWS 3
        TR4B_ROWS 4
        TR4B_ROWS 5
        TR4B_ROWS 6
        TR4B_ROWS 7
        TR4B_ROWS 8
acc16b_tr_exit:
        exit
        .endif

        .else
# ACC=16 EPI=2: b = f16(s + bias[col]), then GELU in f16 in the sigmoid
# form gelu(b) = b / (1 + exp(-2 z)), z = sqrt(2/pi) (b + 0.044715 b^3),
# which has no 1 + tanh cancellation for negative b. Every step is one
# f16v4 op, so one rounding to nearest even of the exact result (exp and
# recip computed in f64, rounded once), with the f16 constants
# c2 = f16(-2 sqrt(2/pi)) = -1.5957 (0xBE62) and
# c3 = f16(-2 sqrt(2/pi) * 0.044715) = -0.071350 (0xAC91), the real
# product rounded once:
#   t = f16(b * b)
#   u = f16(c2 + c3 * t)      (f16v4mac onto a quad of c2)
#   w = f16(b * u)            (= -2 z up to the roundings)
#   e = f16(exp(w))
#   d = f16(e + 1)
#   r = f16(recip(d))
#   y = f16(b * r)
# Large positive b: w -> -inf or a large negative value, e = 0, d = 1,
# r = 1, y = b exactly (also for t = inf, |b| >= 256). Negative b with
# w > 11.09 (b < -4.05 about): e overflows to inf, r = 0 and y = -0,
# where the f64 value of this formula is between -6e-5 (at b = -4.05)
# and 0; that flush is of the size of the tanh form's own error against
# the erf GELU there (-1.0e-4 at -4.05). b = -0 gives -0; b = +inf gives
# +inf; b = -inf and NaN give the canonical NaN.
#
# The arithmetic slot is the bound: P - 1 adds, the bias add, seven GELU
# ops of which exp and recip take two issue slots each: P + 9 slots per
# group, in P + 7 bundles, with no idle arithmetic slot. The main slot
# (P loads, the bias load, the c2 quad load and the store) has four free
# slots per group. A group's loads run in its own bundles (nothing is read
# ahead, so nothing outside the partials is read), while its last two ops
# (recip, the final product) and its store run in the next group's first
# bundles. The rows run one after another without draining: each row's
# first group is peeled out of its hardware loop; its free main slots
# step the walks for the next row and set the loop's walks for this one,
# and its store (of the previous row's last group) steps to this row.
# The first row's peeled group stores an unfinished value at DST (step
# 0): the real result of that group overwrites it one group later, after
# every load of the group that reads DST's bytes if the result aliases a
# partial. After the last row the final group's recip, product and store.
#
# $a0:1 and $a2:3 partials (then the bias in $a2:3), $a4:5 the sum then b,
# $a6:7 t, w, e, d, r in turn, $a8:9 u (the c2 quad, loaded per group by
# the main slot), $a10:11 the result, $a12:13 four f16 ones, $a14:15 four
# c3. $m0 = 8 - (P-1) SECTION (a group's last partial load to the next
# group's partial 0); $m1 the bias of column 0; $m2 the loop's partial
# walk; $m3 the result walk; $m4 rows left; $m5 = RS_SRC - 8; $m6 the
# peeled group's partial walk (row starts); $m7 = RS_DST - 8 (QUADS-1);
# $m8 SECTION; $m9 P; $m10 QUADS - 1; $m12 the constants; $m13 the
# peeled group's store step (0 on the first row, then $m7); $m14 the
# loop's bias walk.

# One group: \walk the partial walk, \bias the bias operand, \step the
# store step of the previous group's result, \first the peeled group
# (whose free main slots set up the walks).
        .macro ACC16_GELU_GROUP P, walk, bias, step, first
        .if \P == 1
        { ld64 $a0:1, [\walk]+=$m0 ; f16v4recip $a6:7, $a6:7 }
        { ld64 $a2:3, \bias ; f16v4mul $a10:11, $a4:5, $a6:7 }
        { st64 $a10:11, [$m3]+=\step ; f16v4add $a4:5, $a0:1, $a2:3 }
        .else
        { ld64 $a0:1, [\walk]+=$m8 ; f16v4recip $a6:7, $a6:7 }
        .if \P == 2
        { ld64 $a2:3, [\walk]+=$m0 ; f16v4mul $a10:11, $a4:5, $a6:7 }
        { ld64 $a2:3, \bias ; f16v4add $a4:5, $a0:1, $a2:3 }
        .else
        { ld64 $a2:3, [\walk]+=$m8 ; f16v4mul $a10:11, $a4:5, $a6:7 }
        .if \P == 3
        { ld64 $a0:1, [\walk]+=$m0 ; f16v4add $a4:5, $a0:1, $a2:3 }
        .else
        { ld64 $a0:1, [\walk]+=$m8 ; f16v4add $a4:5, $a0:1, $a2:3 }
        .rept \P - 4
        { ld64 $a0:1, [\walk]+=$m8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        .endr
        { ld64 $a0:1, [\walk]+=$m0 ; f16v4add $a4:5, $a4:5, $a0:1 }
        .endif
        { ld64 $a2:3, \bias ; f16v4add $a4:5, $a4:5, $a0:1 }
        .endif
        { st64 $a10:11, [$m3]+=\step ; f16v4add $a4:5, $a4:5, $a2:3 }
        .endif
        { ld64 $a8:9, [$m12] ; f16v4mul $a6:7, $a4:5, $a4:5 }
        .if \first
        { mov $m2, $m6 ; f16v4mac $a8:9, $a14:15, $a6:7 }
        { add $m6, $m6, $m5 ; f16v4mul $a6:7, $a4:5, $a8:9 }
        { add $m14, $m1, 8 ; f16v4exp $a6:7, $a6:7 }
        { mov $m13, $m7 ; f16v4add $a6:7, $a6:7, $a12:13 }
        .else
        f16v4mac $a8:9, $a14:15, $a6:7
        f16v4mul $a6:7, $a4:5, $a8:9
        f16v4exp $a6:7, $a6:7
        f16v4add $a6:7, $a6:7, $a12:13
        .endif
        .endm

        .macro ACC16_GELU_ROWS P
acc16g_first_\P:
        ACC16_GELU_GROUP \P, $m6, [$m1], $m13, 1
        rpt $m10, \P + 7
        ACC16_GELU_GROUP \P, $m2, [$m14]+=8, 8, 0
        brnzdec $m4, acc16g_first_\P
        f16v4recip $a6:7, $a6:7
        f16v4mul $a10:11, $a4:5, $a6:7
        st64 $a10:11, [$m3]
        exit
        .endm

        .text
        .globl reduce_f32
        .entry reduce_f32
reduce_f32:
        ld32 $m6, [$m0 + ST_SRC]
        ld32 $m8, [$m0 + ST_SECTION]
        ld32 $m9, [$m0 + ST_P]
        ld32 $m11, [$m0 + ST_RS_SRC]
        ld32 $m3, [$m0 + ST_DST]
        ld32 $m12, [$m0 + ST_RS_DST]
        ld32 $m4, [$m0 + ST_ROWS]
        ld32 $m10, [$m0 + ST_QUADS]
        ld32 $m1, [$m0 + ST_BIAS]
        add $m4, $m4, -1
        add $m10, $m10, -1
        # $m13 = (P-1) SECTION, $m5 = 8 (QUADS-1) until reused.
        add $m13, $m9, -1
        mul $m13, $m13, $m8
        sub $m0, $mzero, $m13
        add $m0, $m0, 8
        shl $m5, $m10, 3
        sub $m7, $m12, $m5
        add $m5, $m11, -8
        setzi $m12, acc16_gelu_constants
        ld64 $a12:13, [$m12 + 8]
        ld64 $a14:15, [$m12 + 16]
        setzi $m13, 0
        min $m11, $m9, ACC16_UNROLLED + 1
        shl $m11, $m11, 2
        setzi $m2, acc16g_table - 4
        add $m11, $m11, $m2
        br $m11
acc16g_table:
        br acc16g_first_1
        br acc16g_first_2
        br acc16g_first_3
        br acc16g_first_4
        br acc16g_first_5
        br acc16g_first_6
        br acc16g_first_7
        br acc16g_first_8
        br acc16e_generic

        ACC16_GELU_ROWS 1
        ACC16_GELU_ROWS 2
        ACC16_GELU_ROWS 3
        ACC16_GELU_ROWS 4
        ACC16_GELU_ROWS 5
        ACC16_GELU_ROWS 6
        ACC16_GELU_ROWS 7
        ACC16_GELU_ROWS 8
        .endif

        .if EPI != 0
# P > ACC16_UNROLLED, EPI 1 and 2: one group per iteration of a brnzdec
# loop, partials 3..P-2 in a one-bundle hardware loop, the epilogue and the
# store inside the group (nothing read ahead, nothing lagged); each row's
# end steps the walks: $m13 = RS_SRC - 8 QUADS, $m7 = RS_DST - 8 QUADS,
# $m5 = -8 QUADS (the bias walk back to column 0); $m9 = P - 4, $m11 the
# groups left in the row.
acc16e_generic:
        .if EPI == 1
        # Undo the read-ahead of the first partial 0.
        sub $m2, $m2, $m8
        add $m5, $m5, -8
        .else
        mov $m2, $m6
        shl $m11, $m10, 3
        sub $m13, $m5, $m11
        sub $m5, $mzero, $m11
        add $m5, $m5, -8
        mov $m14, $m1
        .endif
        # Every group's store steps the result walk, so a row ends one
        # group past its last: the row step is one group's step less than
        # the unrolled paths' $m7 (TR=1: a column, RS_DST).
        .if TR == 1
        sub $m7, $m7, $m12
        .else
        add $m7, $m7, -8
        .endif
        add $m9, $m9, -4
acc16e_generic_row:
        mov $m11, $m10
acc16e_generic_quad:
        ld64 $a2:3, [$m2]+=$m8
        ld64 $a0:1, [$m2]+=$m8
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add $a4:5, $a2:3, $a0:1 }
        rpt $m9, 1
        { ld64 $a0:1, [$m2]+=$m8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a0:1, [$m2]+=$m0 ; f16v4add $a4:5, $a4:5, $a0:1 }
        { ld64 $a2:3, [$m14]+=8 ; f16v4add $a4:5, $a4:5, $a0:1 }
        f16v4add $a4:5, $a4:5, $a2:3
        .if EPI == 2
        { ld64 $a8:9, [$m12] ; f16v4mul $a6:7, $a4:5, $a4:5 }
        f16v4mac $a8:9, $a14:15, $a6:7
        f16v4mul $a6:7, $a4:5, $a8:9
        f16v4exp $a6:7, $a6:7
        f16v4add $a6:7, $a6:7, $a12:13
        f16v4recip $a6:7, $a6:7
        f16v4mul $a4:5, $a4:5, $a6:7
        .endif
        ACC16_STORE_NEXT
        brnzdec $m11, acc16e_generic_quad
        add $m2, $m2, $m13
        add $m3, $m3, $m7
        add $m14, $m14, $m5
        brnzdec $m4, acc16e_generic_row
        exit
        .endif

        .else

# $m2 partial walk, $m3 result walk, $m4 rows left, $m5 quads left in the
# row, $m6 source row start, $m7 result row start, $m8 SECTION, $m9 P - 1,
# $m10 QUADS - 1, $m11 RS_SRC, $m12 RS_DST, $m13 quad source. IN=32: $a14:15
# stay zero (workers start with zeroed registers) and clear $a2:3 between
# groups. IN=16: $a14:15 hold -0 in both lanes and reset the lanes 2-3 sum
# $a6:7 between groups; -0 is the exact identity of f32 addition (x + -0 = x
# also for x = -0, where + 0 would give +0), so the pipelined loop below adds
# partial 0's lanes 2-3 to it without changing a bit.
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
        .if IN == 16
        sethi $a6, 0x80000
        sethi $a7, 0x80000
        { ld32 $m4, [$m0 + ST_ROWS] ; mov64 $a14:15, $a6:7 }
        .else
        ld32 $m4, [$m0 + ST_ROWS]
        .endif
        add $m4, $m4, -1
        ld32 $m10, [$m0 + ST_QUADS]
        add $m10, $m10, -1
        .if EPI == 1 || EPI == 2
        ld32 $m1, [$m0 + ST_BIAS]
        .endif
        .if EPI >= 2
        # The state is read; $m0 now points at the GELU constants.
        setzi $m0, gelu_constants
        .endif
        .if TR == 1 && EPI == 0
        # The state is read. The walks $m13 (source) and $m3 (result) run on
        # from one row to the next, one add each per row: $m0 = 8 * (QUADS
        # - 1), from a row's start to its last group; $m11 = RS_SRC - 8 *
        # QUADS, from a row's end to the next row; $m7 = 2 - 4 * QUADS *
        # RS_DST, from the column after a row's last to the next row's
        # first.
        shl $m0, $m10, 3
        sub $m11, $m11, $m0
        add $m11, $m11, -8
        add $m2, $m10, 1
        mul $m2, $m2, $m12
        shl $m2, $m2, 2
        mov $m3, $m7
        sub $m7, $mzero, $m2
        add $m7, $m7, 2
        mov $m13, $m6
        .endif
row:
        .if TR == 1 && EPI == 0
        mov $m5, $m10
        # $m1 = the row's last group: the read-ahead of a group's partial 0
        # (in the tail of the group before) never goes past it, so that the
        # kernel reads nothing outside the partials.
        add $m1, $m13, $m0
        ld64 $a0:1, [$m13]
        .else
        mov $m13, $m6
        mov $m3, $m7
        mov $m5, $m10
        .if EPI == 1 || EPI == 2
        mov $m14, $m1
        .endif
        .endif
quad:
        .if IN == 16
        # Partial 0 widened: lanes 0-1 into the sum $a4:5, lanes 2-3 into
        # $a10:11 (added to the -0 in $a6:7 by the loop's first bundle or
        # after it). TR=1 EPI=0: it is already in $a0:1 (read ahead).
        .if TR == 0 || EPI != 0
        ld64 $a0:1, [$m13]
        .endif
        { add $m2, $m13, $m8 ; f16v2tof32 $a4:5, $a0 }
        { add $m13, $m13, 8 ; f16v2tof32 $a10:11, $a1 }
        # Partials 1..P-1: load the next while adding the previous one's
        # lanes 2-3, widen, add lanes 0-1 (the arithmetic slot is the bound:
        # two widenings and two adds per partial).
        rpt $m9, 4
        { ld64 $a0:1, [$m2]+=$m8 ; f32v2add $a6:7, $a6:7, $a10:11 }
        f16v2tof32 $a2:3, $a0
        f16v2tof32 $a10:11, $a1
        f32v2add $a4:5, $a4:5, $a2:3
        .if TR == 0 || EPI != 0
        f32v2add $a6:7, $a6:7, $a10:11
        .endif
        .else
        mov $m2, $m13
        ld128 $a4:7, [$m2]+=$m8
        # Partials 1..P-1: load the next while adding the previous one's halves.
        rpt $m9, 2
        { ld128 $a0:3, [$m2]+=$m8 ; f32v2add $a6:7, $a6:7, $a2:3 }
        f32v2add $a4:5, $a4:5, $a0:1
        f32v2add $a6:7, $a6:7, $a2:3
        .endif
        .if TR == 1 && EPI == 0
        # Transposed, no epilogue: the lanes 2-3 sum $a6:7 is drained
        # while lanes 0-1 are stored; pack16hi moves lanes 1 and 3 into the
        # low halves st16 stores. $m14 = the next group (the row's last
        # group for the last one, re-read harmlessly), read into $a0:1 once
        # the loop has consumed it. Column c, c+1, c+2, c+3 of this row are
        # RS_DST apart, so $m3 ends on column c+4.
        { min $m14, $m13, $m1 ; f32v2tof16 $a8, $a4:5 }
        { st16 $a8, [$m3]+=$m12 ; pack16hi $a12, $a8, $a8 }
        { st16 $a12, [$m3]+=$m12 ; f32v2add $a6:7, $a6:7, $a10:11 }
        { ld64 $a0:1, [$m14] ; f32v2tof16 $a9, $a6:7 }
        { st16 $a9, [$m3]+=$m12 ; pack16hi $a13, $a9, $a9 }
        { st16 $a13, [$m3]+=$m12 ; mov64 $a6:7, $a14:15 }
        .elseif OUT == 16
        .if IN == 16
        f32v2tof16 $a8, $a4:5
        .else
        { add $m13, $m13, 16 ; f32v2tof16 $a8, $a4:5 }
        .endif
        f32v2tof16 $a9, $a6:7
        .if EPI == 1 || EPI == 2
        # + bias, rounded to f16 where the graph stores the sum.
        { ld64 $a10:11, [$m14]+=8 ; f16v2tof32 $a4:5, $a8 }
        f16v2tof32 $a6:7, $a9
        f16v2tof32 $a0:1, $a10
        f16v2tof32 $a2:3, $a11
        f32v2add $a4:5, $a4:5, $a0:1
        f32v2add $a6:7, $a6:7, $a2:3
        f32v2tof16 $a8, $a4:5
        f32v2tof16 $a9, $a6:7
        .endif
        .if EPI >= 2
        f16v2tof32 $a4:5, $a8
        f16v2tof32 $a6:7, $a9
        GELU $a4:5
        GELU $a6:7
        f32v2tof16 $a8, $a4:5
        f32v2tof16 $a9, $a6:7
        .endif
        .if TR == 1
        # Transposed after an epilogue: columns c..c+3 one st16 each.
        { st16 $a8, [$m3]+=$m12 ; pack16hi $a12, $a8, $a8 }
        { st16 $a12, [$m3]+=$m12 ; pack16hi $a13, $a9, $a9 }
        { st16 $a9, [$m3]+=$m12 ; mov64 $a6:7, $a14:15 }
        st16 $a13, [$m3]+=$m12
        .elseif IN == 16
        { st64 $a8:9, [$m3]+=8 ; mov64 $a6:7, $a14:15 }
        .else
        { st64 $a8:9, [$m3]+=8 ; mov64 $a2:3, $a14:15 }
        .endif
        .elseif IN == 16
        st64 $a4:5, [$m3]+=8
        # The store reads $a6:7 before the move resets it.
        { st64 $a6:7, [$m3]+=8 ; mov64 $a6:7, $a14:15 }
        .else
        .if EPI == 1 || EPI == 2
        # + bias, f32 (OUT=32: the graph stores the sum in f32 too).
        ld64 $a0:1, [$m14]+=8
        { ld64 $a2:3, [$m14]+=8 ; f32v2add $a4:5, $a4:5, $a0:1 }
        f32v2add $a6:7, $a6:7, $a2:3
        .endif
        .if EPI >= 2
        GELU $a4:5
        GELU $a6:7
        .endif
        { st64 $a4:5, [$m3]+=8 ; mov64 $a2:3, $a14:15 }
        { st64 $a6:7, [$m3]+=8 ; nop }
        add $m13, $m13, 16
        .endif
        brnzdec $m5, quad
        .if TR == 1 && EPI == 0
        add $m13, $m13, $m11
        add $m3, $m3, $m7
        .else
        add $m6, $m6, $m11
        .if TR == 1
        # The next row is the next f16 of every column.
        add $m7, $m7, 2
        .else
        add $m7, $m7, $m12
        .endif
        .endif
        brnzdec $m4, row
        exit
        .endif

        .if EPI >= 2 && ACC == 32
        .data
        .align 8
gelu_constants:
        .float 0.044715, 0.044715
        .float 0.7978845608028654, 0.7978845608028654
        .float 1.0, 1.0
        .float 0.5, 0.5
        .endif

# The f16 constant quads of ACC=16 EPI=2: c2, ones, c3 (see above).
        .if EPI == 2 && ACC == 16
        .data
        .align 8
acc16_gelu_constants:
        .half 0xBE62, 0xBE62, 0xBE62, 0xBE62
        .half 0x3C00, 0x3C00, 0x3C00, 0x3C00
        .half 0xAC91, 0xAC91, 0xAC91, 0xAC91
        .endif
