# Row-wise layer normalisation of an [ROWS, COLS] f16 matrix:
#   y[r, c] = f16((x[r, c] - mean[r]) * rsqrt(var[r] + EPS) * GAMMA[c] + BETA[c])
# with mean and the biased variance var = sum_c (x - mean)^2 / COLS in f32;
# only the output is f16 (round to nearest even).
#
# Any ROWS >= 1 and COLS >= 1: a row is COLS >> 2 groups of four (vector
# path, `ld64`/`st64`) and then COLS & 3 single elements (scalar path,
# `ld16`/`st16`).
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

        .kernel layernorm_f16
        .workers 6
        # Per row: 47 issue slots plus 2 per group in pass 1, 6 in pass 2,
        # 10 in pass 3 (18 per group of four), and 4 + 4 + 7 per tail
        # element; without `%`: 18 * (COLS / 4) + 15 * (COLS % 4)
        # = 15 * COLS - 42 * (COLS / 4).
        .cycles "6 * (13 + ROWS * (47 + 15 * COLS - 42 * (COLS / 4)))"

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
        .globl layernorm_f16
        .entry layernorm_f16
layernorm_f16:
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
        rpt $m5, 2
        { ld64 $a0:1, [$m7]+=8 ; f32add $a2, $a2, $a3 }
        f16v4hsum $a3, $a0:1
        { ld32 $m9, [$m0 + ST_COLS] ; f32add $a2, $a2, $a3 }
        rpt $m6, 3
        ld16 $a0, [$m7]+=2
        f16v2tof32 $a0:1, $a0
        f32add $a2, $a2, $a0
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
        ld64 $a0:1, [$m7]+=8
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
        { ld32 $a14, [$m0 + ST_EPS] ; f32mul $a6, $a6, $a15 }
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
        brz $m5, p3_tail
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
p3_tail:
        rpt $m6, 7
        ld16 $a0, [$m1]+=2
        { ld16 $a2, [$m14]+=2 ; f16v2tof32 $a8:9, $a0 }
        { ld32 $a0, [$m8]+=4 ; f16v2tof32 $a12:13, $a2 }
        f32mul $a0, $a0, $a6
        f32mac $a12, $a0, $a8
        f32v2tof16 $a14, $a12:13
        st16 $a14, [$m7]+=2
        ld32 $m9, [$m0 + ST_RS_IN]
        add $m2, $m2, $m9
        ld32 $m9, [$m0 + ST_RS_OUT]
        add $m3, $m3, $m9
        brnzdec $m4, row
        exit
