# Row-wise layer normalisation of an [ROWS, COLS] f16 matrix:
#   y[r, c] = f16((x[r, c] - mean[r]) * rsqrt(var[r] + EPS) * GAMMA[c] + BETA[c])
# with mean and the biased variance var = sum_c (x - mean)^2 / COLS in f32;
# only the output is f16 (round to nearest even).
#
# TYPE=32: x, GAMMA, BETA and y are f32 instead (every address, stride and
# count below stays the same, elements are 4 bytes), and y is the f32 fused
# multiply-add itself. The statistics are formed in the same order with
# the same roundings, except that a group of four f32 adds as two pairs in
# the two lanes of an f32 accumulator (`f32v2add`, joined by `f32v2hsum`
# after the row), where an f16 group's `f16v4hsum` is exact.
#
# Any ROWS >= 1 and COLS >= 1: a row is COLS >> 2 groups of four (vector
# path, `ld64`/`st64`) and then COLS & 3 single elements (scalar path,
# `ld16`/`st16`; `ld32`/`st32` with TYPE=32).
#
# Vertex state (u32 words, byte offsets):
#    0 IN      address of x[0, 0] (f16, 8-aligned, any region)
#    4 RS_IN   input row stride in bytes (multiple of 8)
#    8 OUT     address of y[0, 0] (f16, 8-aligned; may equal IN: pass 3
#              reads only SCRATCH, GAMMA and BETA)
#   12 RS_OUT  output row stride in bytes (multiple of 8)
#   16 ROWS    rows (>= 1)
#   20 COLS    columns (>= 1)
#   24 GAMMA   address of the f16 scale vector (COLS values, 8-aligned)
#   28 BETA    address of the f16 shift vector (COLS values, 8-aligned)
#   32 EPS     f32 bits of epsilon (>= 0; added to the variance)
#   36 SCRATCH this vertex's own scratch of 4 * COLS + 8 bytes, 8-aligned:
#              one row of d = x - mean as f32
#
# Over-reads: pass 2 loads the group after a row's last group of four and
# pass 3 the group after GAMMA's last group (software pipelining); those 8
# bytes must lie in SRAM, their values are never used.
#
# Each worker runs its own vertex (its own state block and scratch, a
# contiguous range of rows); GAMMA and BETA are shared read-only.
#
# Three passes per row: (1) mean: `f16v4hsum` sums a group of four in one
# issue slot (exact in f64, rounded to f32) and an f32 add accumulates;
# (2) d = f32(x) - mean into SCRATCH and the f32 sum of d^2 (two lanes,
# fused multiply-adds, joined by `f32v2hsum`); r = rsqrt(var + EPS) by the
# ISA's `f32rsqrt` (rounded once from f64); (3) y = f16(d * r * gamma +
# beta): d * r rounded to f32, then one fused multiply-add onto beta.
# The two-pass variance never subtracts large sums (no cancellation).

#
# Split rows (STAGE = 1, 2, 3; issue 5). With one row per tile, STAGE 0
# keeps one worker busy and five idle. The split kernels spread ONE row
# over NPARTS (1..6) vertices, each owning a slice: a contiguous range of
# the row's groups of four, the row's COLS & 3 tail elements belonging to
# its last slice only. They run as three successive compute steps on the
# tile (every vertex of a step finishes before the next step starts), and
# meet in the row's partials PARTS (2 * NPARTS f32 words):
#   STAGE 1: s = the slice's sum, formed exactly as pass 1 forms a row's
#            sum, stored at PARTS[SLOT];
#   STAGE 2: S = +0 + PARTS[0] + ... + PARTS[NPARTS - 1] (f32, slot order),
#            mean = S * f32recip(COLS) as pass 1; d = f32(x) - mean into
#            SCRATCH and the slice's sum of d^2 as pass 2 forms it, stored
#            at PARTS[NPARTS + SLOT];
#   STAGE 3: V = +0 + PARTS[NPARTS] + ... + PARTS[2 NPARTS - 1] (f32, slot
#            order), r = rsqrt(V * (1/COLS) + EPS) as pass 2; y as pass 3.
# The first partial sum adds +0 (exact: a partial is never -0, its sum
# starting from +0), so with NPARTS = 1 every value, and so every output
# bit, equals STAGE 0's.
#
# Vertex state of STAGE 1..3 (u32 words, byte offsets; one layout for the
# three stages, a stage ignores the words it does not use):
#    0 IN      address of x[row, first column of the slice] (8-aligned)
#    4 OUT     address of y[row, first column of the slice] (8-aligned; may
#              equal IN: stage 3 reads only SCRATCH, GAMMA, BETA and PARTS)
#    8 QUADS   groups of four in the slice (>= 0)
#   12 TAIL    single elements after the groups (0..3; nonzero only in the
#              row's last slice)
#   16 COLS    the whole row's element count (>= 1)
#   20 GAMMA   address of gamma at the slice's first column (8-aligned)
#   24 BETA    address of beta at the slice's first column (8-aligned)
#   28 EPS     f32 bits of epsilon
#   32 SCRATCH address of the slice's part of the row's f32 scratch (4
#              bytes per column, 8-aligned): stage 2 writes its 16 * QUADS
#              + 4 * TAIL bytes, stage 3 reads them
#   36 PARTS   address of the row's partials (2 * NPARTS f32 words,
#              8-aligned); the slice writes only PARTS[SLOT] (stage 1) and
#              PARTS[NPARTS + SLOT] (stage 2)
#   40 NPARTS  slices of the row (1..6)
#   44 SLOT    this slice's index (0..NPARTS - 1)
# Stages read: 1 IN QUADS TAIL PARTS SLOT; 2 IN QUADS TAIL COLS SCRATCH
# PARTS NPARTS SLOT; 3 OUT QUADS TAIL COLS GAMMA BETA EPS SCRATCH PARTS
# NPARTS.
#
# Over-reads of the split stages: stage 2 always loads the 8 bytes at
# IN + 8 * QUADS (the group after the slice's last group: the next slice's
# first group, or for the row's last slice the 8 bytes after the row's
# last group, which STAGE 0 reads too); stage 3, when QUADS >= 1, loads the
# 8 bytes at GAMMA + 8 * QUADS (likewise within gamma or STAGE 0's gamma
# over-read). Stage 1 reads only its slice. Their values are never used.

        .kernel layernorm
        .param STAGE, 0
        .param TYPE, 16
        .if STAGE < 0 || STAGE > 3
        .error "STAGE must be 0 (whole rows) or 1, 2, 3 (the three steps of a row split over several vertices)"
        .endif
        .if TYPE != 16 && TYPE != 32
        .error "TYPE must be 16 (f16 rows, gamma, beta and output) or 32 (f32)"
        .endif
        .workers 6

# The loops every stage shares, one definition each (the STAGE 0 passes
# and the split stages run the same per-group code on a row or a slice).

# Pass 1: the sum of $m5 groups and $m6 tail elements from the input walk
# $m7 into $a2 (which starts at zero, as $a3 does). f16: each group's
# `f16v4hsum` is added by the next group's first bundle (and once after the
# loop). f32: the pairs add in the two lanes of $a2:3, each bundle adding
# the pair that the previous one loaded (and once after the loop), so
# $a0:1 must start at zero. The bundle after the loop also prepares $m9:
# COLS (STAGE 0) or 4 * SLOT (STAGE 1).
        .macro PASS1
        .if TYPE == 32
        rpt $m5, 2
        { ld64 $a0:1, [$m7]+=8 ; f32v2add $a2:3, $a2:3, $a0:1 }
        { ld64 $a0:1, [$m7]+=8 ; f32v2add $a2:3, $a2:3, $a0:1 }
        .if STAGE == 0
        { ld32 $m9, [$m0 + ST_COLS] ; f32v2add $a2:3, $a2:3, $a0:1 }
        .else
        { shl $m9, $m9, 2 ; f32v2add $a2:3, $a2:3, $a0:1 }
        .endif
        f32v2hsum $a2, $a2:3
        rpt $m6, 2
        ld32 $a0, [$m7]+=4
        f32add $a2, $a2, $a0
        .else
        rpt $m5, 2
        { ld64 $a0:1, [$m7]+=8 ; f32add $a2, $a2, $a3 }
        f16v4hsum $a3, $a0:1
        .if STAGE == 0
        { ld32 $m9, [$m0 + ST_COLS] ; f32add $a2, $a2, $a3 }
        .else
        { shl $m9, $m9, 2 ; f32add $a2, $a2, $a3 }
        .endif
        rpt $m6, 3
        ld16 $a0, [$m7]+=2
        f16v2tof32 $a0:1, $a0
        f32add $a2, $a2, $a0
        .endif
        .endm

# Pass 2's loop: d = x - mean (the pair $a4:5) into the SCRATCH walk $m8
# and the sum of d^2 into $a6 (two lanes joined after the groups), over
# $m5 groups from the input walk $m7, whose first group is already in
# $a0:1 (the loop loads the next group in its last bundle), then $m6 tail
# elements starting 8 bytes back.
        .macro PASS2_LOOP
        .if TYPE == 32
        # f32: each group is two pairs, the second loaded by the first
        # bundle and the next group's first by the second. The sum of d
        # goes into the pair $a12:13 (which starts at zero): the mean's own
        # f32 rounding, u |mean|, is in every d, and a row whose spread is
        # far below its mean would carry it into d / std amplified by
        # |mean| / std; sum(d) / COLS is that rounding, which pass 3
        # subtracts (the corrected two-pass algorithm).
        rpt $m5, 6
        { ld64 $a2:3, [$m7]+=8 ; f32v2sub $a8:9, $a0:1, $a4:5 }
        { ld64 $a0:1, [$m7]+=8 ; f32v2sub $a10:11, $a2:3, $a4:5 }
        { st64 $a8:9, [$m8]+=8 ; f32v2mac $a6:7, $a8:9, $a8:9 }
        { st64 $a10:11, [$m8]+=8 ; f32v2mac $a6:7, $a10:11, $a10:11 }
        f32v2add $a12:13, $a12:13, $a8:9
        f32v2add $a12:13, $a12:13, $a10:11
        { add $m7, $m7, -8 ; f32v2hsum $a6, $a6:7 }
        f32v2hsum $a12, $a12:13
        rpt $m6, 4
        ld32 $a0, [$m7]+=4
        f32sub $a0, $a0, $a4
        { st32 $a0, [$m8]+=4 ; f32mac $a6, $a0, $a0 }
        f32add $a12, $a12, $a0
        .else
        rpt $m5, 6
        f16v2tof32 $a8:9, $a0
        f16v2tof32 $a10:11, $a1
        f32v2sub $a8:9, $a8:9, $a4:5
        { st64 $a8:9, [$m8]+=8 ; f32v2sub $a10:11, $a10:11, $a4:5 }
        { st64 $a10:11, [$m8]+=8 ; f32v2mac $a6:7, $a8:9, $a8:9 }
        { ld64 $a0:1, [$m7]+=8 ; f32v2mac $a6:7, $a10:11, $a10:11 }
        { add $m7, $m7, -8 ; f32v2hsum $a6, $a6:7 }
        rpt $m6, 4
        ld16 $a0, [$m7]+=2
        f16v2tof32 $a0:1, $a0
        f32sub $a0, $a0, $a4
        { st32 $a0, [$m8]+=4 ; f32mac $a6, $a0, $a0 }
        .endif
        .endm

# TYPE=32, after pass 2: with $a6 = sum(d^2) / COLS, $a12 = sum(d) and
# $a15 = 1 / COLS, c = sum(d) / COLS (the mean's rounding) into the pair
# $a4:5 for pass 3, and $a6 = sum(d^2) / COLS - c^2, the variance about the
# corrected mean (never below zero).
        .macro CORRECT
        f32mul $a12, $a12, $a15
        f32mul $a13, $a12, $a12
        f32sub $a6, $a6, $a13
        setzi $a13, 0
        f32max $a6, $a6, $a13
        f32v2bcast $a4:5, $a12
        .endm

# Pass 3: y = f16(d * r * gamma + beta) with r in the pair $a6:7, over $m5
# groups ($m10 = groups - 1) and $m6 tail elements: d from the SCRATCH walk
# $m8, gamma from $m1, beta from $m14, y to the output walk $m7. gamma and
# beta convert to f32 in registers ($a8:11 and $a12:13, $a4:5); beta is the
# accumulator of the fused multiply-add. Each group's output is stored by
# the next group's third bundle, so the first group runs without a store
# before the loop and the last store follows it.
        .macro PASS3
        .if TYPE == 32
        # f32: pair by pair, y = beta + (d * r) * gamma with beta as the
        # accumulator; a pair's result is stored in the loop's third bundle,
        # after the next pair's d and gamma are loaded, and the last after
        # the loop ($m10 = pairs - 1).
        # d is corrected by the pair (c, c) in $a4:5 first (pass 2's sum
        # of d over COLS), in the bundle after its load.
        brz $m5, pass3_tail\@
        shl $m10, $m5, 1
        add $m10, $m10, -1
        ld64 $a0:1, [$m8]+=8
        { ld64 $a8:9, [$m1]+=8 ; f32v2sub $a0:1, $a0:1, $a4:5 }
        { ld64 $a12:13, [$m14]+=8 ; f32v2mul $a2:3, $a0:1, $a6:7 }
        rpt $m10, 4
        { ld64 $a0:1, [$m8]+=8 ; f32v2mac $a12:13, $a2:3, $a8:9 }
        { ld64 $a8:9, [$m1]+=8 ; f32v2sub $a0:1, $a0:1, $a4:5 }
        { st64 $a12:13, [$m7]+=8 ; f32v2mul $a2:3, $a0:1, $a6:7 }
        ld64 $a12:13, [$m14]+=8
        f32v2mac $a12:13, $a2:3, $a8:9
        st64 $a12:13, [$m7]+=8
pass3_tail\@:
        rpt $m6, 5
        ld32 $a0, [$m8]+=4
        { ld32 $a8, [$m1]+=4 ; f32sub $a0, $a0, $a4 }
        { ld32 $a12, [$m14]+=4 ; f32mul $a0, $a0, $a6 }
        f32mac $a12, $a0, $a8
        st32 $a12, [$m7]+=4
        .else
        brz $m5, pass3_tail\@
        ld64 $a0:1, [$m1]+=8
        { ld64 $a2:3, [$m14]+=8 ; f16v2tof32 $a8:9, $a0 }
        { ld64 $a0:1, [$m8]+=8 ; f16v2tof32 $a10:11, $a1 }
        f16v2tof32 $a12:13, $a2
        { ld64 $a2:3, [$m8]+=8 ; f16v2tof32 $a4:5, $a3 }
        f32v2mul $a0:1, $a0:1, $a6:7
        f32v2mul $a2:3, $a2:3, $a6:7
        f32v2mac $a12:13, $a0:1, $a8:9
        { ld64 $a0:1, [$m1]+=8 ; f32v2mac $a4:5, $a2:3, $a10:11 }
        f32v2tof16 $a14, $a12:13
        f32v2tof16 $a15, $a4:5
        rpt $m10, 10
        { ld64 $a2:3, [$m14]+=8 ; f16v2tof32 $a8:9, $a0 }
        { ld64 $a0:1, [$m8]+=8 ; f16v2tof32 $a10:11, $a1 }
        { st64 $a14:15, [$m7]+=8 ; f16v2tof32 $a12:13, $a2 }
        { ld64 $a2:3, [$m8]+=8 ; f16v2tof32 $a4:5, $a3 }
        f32v2mul $a0:1, $a0:1, $a6:7
        f32v2mul $a2:3, $a2:3, $a6:7
        f32v2mac $a12:13, $a0:1, $a8:9
        { ld64 $a0:1, [$m1]+=8 ; f32v2mac $a4:5, $a2:3, $a10:11 }
        f32v2tof16 $a14, $a12:13
        f32v2tof16 $a15, $a4:5
        st64 $a14:15, [$m7]+=8
        # The loop's gamma walk ran one group ahead.
        add $m1, $m1, -8
pass3_tail\@:
        rpt $m6, 7
        ld16 $a0, [$m1]+=2
        { ld16 $a2, [$m14]+=2 ; f16v2tof32 $a8:9, $a0 }
        { ld32 $a0, [$m8]+=4 ; f16v2tof32 $a12:13, $a2 }
        f32mul $a0, $a0, $a6
        f32mac $a12, $a0, $a8
        f32v2tof16 $a14, $a12:13
        st16 $a14, [$m7]+=2
        .endif
        .endm

        .if STAGE == 0
        # Per row: 47 issue slots plus 2 per group in pass 1, 6 in pass 2,
        # 10 in pass 3 (18 per group of four), and 4 + 4 + 7 per tail
        # element; without `%`: 18 * (COLS / 4) + 15 * (COLS % 4)
        # = 15 * COLS - 42 * (COLS / 4).
        .if TYPE == 32
        # TYPE=32: 2 slots per group in pass 1, 6 in pass 2 (with the sum
        # of d) and 8 in pass 3 (16 per group) and 2 + 4 + 5 per tail
        # element, two more set-up slots in pass 1, eight for the
        # corrected mean and one more per row and tail element as TYPE=16
        # has.
        .cycles "6 * (13 + ROWS * (60 + 12 * COLS - 32 * (COLS / 4)))"
        .else
        .cycles "6 * (13 + ROWS * (47 + 15 * COLS - 42 * (COLS / 4)))"
        .endif

        .equ ST_IN, 0
        .equ ST_RS_IN, 4
        .equ ST_OUT, 8
        .equ ST_RS_OUT, 12
        .equ ST_ROWS, 16
        .equ ST_COLS, 20
        .equ ST_GAMMA, 24
        .equ ST_BETA, 28
        .equ ST_EPS, 32
        .equ ST_SCRATCH, 36

# Registers: $m2 input row, $m3 output row, $m4 rows left - 1, $m5 groups
# of four per row, $m6 tail elements, $m10 groups - 1, $m7 input/output
# walk, $m8 SCRATCH walk, $m1 GAMMA walk, $m14 BETA walk, $m9 scratch
# integer, $m11 SCRATCH, $m12 GAMMA, $m13 BETA. $a4:5 the (mean, mean)
# pair, $a6:7 the (r, r) pair, $a15 1/COLS; pass 3 builds outputs in
# $a14:15.

        .text
        .globl layernorm
        .entry layernorm
layernorm:
        ld32 $m2, [$m0 + ST_IN]
        ld32 $m3, [$m0 + ST_OUT]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m6, [$m0 + ST_COLS]
        shr $m5, $m6, 2
        and $m6, $m6, 3
        add $m10, $m5, -1
        ld32 $m11, [$m0 + ST_SCRATCH]
        ld32 $m12, [$m0 + ST_GAMMA]
        ld32 $m13, [$m0 + ST_BETA]
row:
        # Pass 1: mean. Each group's `f16v4hsum` is added by the next
        # group's first bundle (and once after the loop), so $a3 starts at 0.
        mov $m7, $m2
        setzi $a2, 0
        setzi $a3, 0
        .if TYPE == 32
        # $a0:1 starts at zero (PASS1 adds it first).
        setzi $a0, 0
        setzi $a1, 0
        .endif
        PASS1
        mov $a15, $m9
        i32tof32 $a15, $a15
        f32recip $a15, $a15
        f32mul $a2, $a2, $a15
        f32v2bcast $a4:5, $a2

        # Pass 2: d = x - mean into SCRATCH, sum of d^2 in the pair $a6:7.
        # The loop loads the next group in its last bundle (the first group
        # is loaded before it); the tail starts 8 bytes back.
        mov $m7, $m2
        mov $m8, $m11
        setzi $a6, 0
        setzi $a7, 0
        .if TYPE == 32
        setzi $a12, 0
        setzi $a13, 0
        .endif
        ld64 $a0:1, [$m7]+=8
        PASS2_LOOP
        { ld32 $a14, [$m0 + ST_EPS] ; f32mul $a6, $a6, $a15 }
        .if TYPE == 32
        CORRECT
        .endif
        f32add $a6, $a6, $a14
        f32rsqrt $a6, $a6
        f32v2bcast $a6:7, $a6

        # Pass 3: y = f16(d * r * gamma + beta). gamma and beta convert to
        # f32 in registers ($a8:11 and $a12:13, $a4:5: the mean is no longer
        # needed); beta is the accumulator of the fused multiply-add. Each
        # group's output is stored by the next group's third bundle, so the
        # first group runs without a store before the loop and the last
        # store follows it.
        mov $m7, $m3
        mov $m8, $m11
        mov $m1, $m12
        mov $m14, $m13
        PASS3
        ld32 $m9, [$m0 + ST_RS_IN]
        add $m2, $m2, $m9
        ld32 $m9, [$m0 + ST_RS_OUT]
        add $m3, $m3, $m9
        brnzdec $m4, row
        exit

        .else

# The split stages. A worker's registers start at zero (docs/isa.md,
# calling convention), so the f32 accumulators need no clearing: each
# starts at +0 as STAGE 0's `setzi` leaves them.

        # The vertex's issue slots, plus 2 slots (12 cycles) for the
        # supervisor's launch and exit around it as a one-vertex step
        # measures (the tests: within 2 cycles of the simulator).
        .if STAGE == 1
        # 10 slots of set-up and exit, 2 per group of four, 3 per tail
        # element (STAGE 0's pass 1).
        .if TYPE == 32
        # TYPE=32: one slot more (the lanes' join), 2 per tail element.
        .cycles "6 * (13 + 2 * QUADS + 2 * TAIL)"
        .else
        .cycles "6 * (12 + 2 * QUADS + 3 * TAIL)"
        .endif
        .elseif STAGE == 2
        # 17 slots of set-up and exit, 1 per partial, 6 per group, 4 per
        # tail element (STAGE 0's pass 2).
        .if TYPE == 32
        # TYPE=32: 6 slots per group and 4 per tail element (with the sum of
        # d), 4 more to join its lanes and store it.
        .cycles "6 * (23 + NPARTS + 6 * QUADS + 4 * TAIL)"
        .else
        .cycles "6 * (19 + NPARTS + 6 * QUADS + 4 * TAIL)"
        .endif
        .else
        # 22 slots of set-up and exit, 1 per partial, 10 per group, 7 per
        # tail element (STAGE 0's pass 3); a slice without groups skips the
        # pipeline's 4 slots of fill and drain (1 / (QUADS + 1) is 1 only
        # for QUADS = 0).
        .if TYPE == 32
        # TYPE=32: 8 slots per group, 5 per tail element; the sums of d
        # (1 per partial) and the corrected mean, 9 more.
        .cycles "6 * (33 + 2 * NPARTS + 8 * QUADS + 5 * TAIL - 4 * (1 / (QUADS + 1)))"
        .else
        .cycles "6 * (24 + NPARTS + 10 * QUADS + 7 * TAIL - 4 * (1 / (QUADS + 1)))"
        .endif
        .endif

        .equ SP_IN, 0
        .equ SP_OUT, 4
        .equ SP_QUADS, 8
        .equ SP_TAIL, 12
        .equ SP_COLS, 16
        .equ SP_GAMMA, 20
        .equ SP_BETA, 24
        .equ SP_EPS, 28
        .equ SP_SCRATCH, 32
        .equ SP_PARTS, 36
        .equ SP_NPARTS, 40
        .equ SP_SLOT, 44

        .text
        .globl layernorm
        .entry layernorm
layernorm:
        .if STAGE == 1
# Registers: $m7 input walk, $m5 groups, $m6 tail elements, $m2 PARTS,
# $m9 4 * SLOT; $a2 the slice's sum, $a3 the last group's sum.
        ld32 $m7, [$m0 + SP_IN]
        ld32 $m5, [$m0 + SP_QUADS]
        ld32 $m6, [$m0 + SP_TAIL]
        ld32 $m2, [$m0 + SP_PARTS]
        ld32 $m9, [$m0 + SP_SLOT]
        # Pass 1 of STAGE 0 on the slice: each group's `f16v4hsum` is added
        # by the next group's first bundle (and once after the loop).
        # (A worker's $a0:1 starts at zero, as PASS1 needs.)
        PASS1
        st32 $a2, [$m2 + $m9]
        exit

        .elseif STAGE == 2
# Registers: $m2 partials walk (PARTS[NPARTS] after the sum), $m4 NPARTS,
# $m7 input walk, $m8 SCRATCH walk, $m5 groups, $m6 tail elements, $m9
# COLS then 4 * SLOT; $a2 the row's sum then the mean, $a3 the partial
# being added, $a4:5 the (mean, mean) pair, $a6:7 the sum of d^2 in two
# lanes, $a15 1/COLS.
        ld32 $m2, [$m0 + SP_PARTS]
        ld32 $m4, [$m0 + SP_NPARTS]
        ld32 $m9, [$m0 + SP_COLS]
        # S = +0 + PARTS[0] + ...: each bundle adds the partial that the
        # previous one loaded, so the first adds $a3's initial +0 (exact)
        # and the last add follows the loop.
        rpt $m4, 1
        { ld32 $a3, [$m2]+=4 ; f32add $a2, $a2, $a3 }
        { mov $a15, $m9 ; f32add $a2, $a2, $a3 }
        { ld32 $m7, [$m0 + SP_IN] ; i32tof32 $a15, $a15 }
        { ld32 $m8, [$m0 + SP_SCRATCH] ; f32recip $a15, $a15 }
        { ld32 $m5, [$m0 + SP_QUADS] ; f32mul $a2, $a2, $a15 }
        { ld64 $a0:1, [$m7]+=8 ; f32v2bcast $a4:5, $a2 }
        ld32 $m6, [$m0 + SP_TAIL]
        ld32 $m9, [$m0 + SP_SLOT]
        shl $m9, $m9, 2
        # Pass 2 of STAGE 0 on the slice: the loop loads the next group in
        # its last bundle (the first was loaded above); the tail starts 8
        # bytes back.
        PASS2_LOOP
        st32 $a6, [$m2 + $m9]
        .if TYPE == 32
        # The slice's sum of d at PARTS[2 NPARTS + SLOT].
        shl $m10, $m4, 2
        add $m10, $m10, $m9
        st32 $a12, [$m2 + $m10]
        .endif
        exit

        .else
# Registers: $m2 partials walk, $m4 NPARTS, $m9 COLS, $m10 groups - 1
# (first 4 * NPARTS), $m7 output walk, $m8 SCRATCH walk, $m1 GAMMA walk,
# $m14 BETA walk, $m5 groups, $m6 tail elements; $a2 the variance sum, $a3
# the partial being added, $a6:7 the (r, r) pair, $a14 EPS, $a15 1/COLS;
# pass 3 as in STAGE 0.
        ld32 $m2, [$m0 + SP_PARTS]
        ld32 $m4, [$m0 + SP_NPARTS]
        ld32 $m9, [$m0 + SP_COLS]
        shl $m10, $m4, 2
        add $m2, $m2, $m10
        # V = +0 + PARTS[NPARTS] + ..., as the mean's sum in stage 2.
        rpt $m4, 1
        { ld32 $a3, [$m2]+=4 ; f32add $a2, $a2, $a3 }
        { mov $a15, $m9 ; f32add $a2, $a2, $a3 }
        { ld32 $a14, [$m0 + SP_EPS] ; i32tof32 $a15, $a15 }
        { ld32 $m7, [$m0 + SP_OUT] ; f32recip $a15, $a15 }
        { ld32 $m8, [$m0 + SP_SCRATCH] ; f32mul $a6, $a2, $a15 }
        .if TYPE == 32
        # D = +0 + PARTS[2 NPARTS] + ..., the slices' sums of d, as V.
        setzi $a3, 0
        rpt $m4, 1
        { ld32 $a3, [$m2]+=4 ; f32add $a12, $a12, $a3 }
        f32add $a12, $a12, $a3
        CORRECT
        .endif
        { ld32 $m1, [$m0 + SP_GAMMA] ; f32add $a6, $a6, $a14 }
        { ld32 $m14, [$m0 + SP_BETA] ; f32rsqrt $a6, $a6 }
        { ld32 $m5, [$m0 + SP_QUADS] ; f32v2bcast $a6:7, $a6 }
        ld32 $m6, [$m0 + SP_TAIL]
        add $m10, $m5, -1

        # Pass 3 of STAGE 0 on the slice (see there).
        PASS3
        exit
        .endif
        .endif
