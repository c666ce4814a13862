# Row-wise softmax of an [ROWS, COLS] f16 matrix: y[r, c] = exp(t[r, c] -
# m[r]) / sum_c exp(t[r, c] - m[r]) with t = x * SCALE and m[r] the row
# maximum of t (f32(max(x) * SCALE); t - m is computed with one rounding), written as f16 (round to nearest even). The maximum,
# the exponentials and the sum are f32; only the output is f16.
#
# Any ROWS >= 1 and COLS >= 1: a row is COLS >> 2 groups of four (vector
# path, `ld64`/`st64`) and then COLS & 3 single elements (scalar path,
# `ld16`/`st16`), so COLS need not be a multiple of 4.
#
# Vertex state (u32 words, byte offsets):
#    0 IN      address of x[0, 0] (f16, 8-aligned, any region)
#    4 RS_IN   input row stride in bytes (multiple of 8)
#    8 OUT     address of y[0, 0] (f16, 8-aligned; may equal IN: each group
#              of four is read before it is written)
#   12 RS_OUT  output row stride in bytes (multiple of 8)
#   16 ROWS    rows (>= 1)
#   20 COLS    columns (>= 1)
#   24 SCALE   f32 bits of the scale applied before the maximum (> 0, e.g.
#              1.0 for a plain softmax or 1/sqrt(d) in attention)
#   28 SCRATCH this vertex's own scratch of 4 * COLS + 16 bytes, 8-aligned:
#              the pair (-m, -m) and one row of f32 exponentials
#
# SCALE must be positive: the pass that finds the maximum runs on the raw
# f16 values (`f16v4hmax`) and scales the maximum once, which equals the
# maximum of the scaled values only for a positive (monotone) scale.
#
# Each worker runs its own vertex (its own state block, a contiguous range
# of rows); workers never share a row, so no worker reads another's output.
#
# Three passes per row: (1) maximum of the raw row, (2) e = exp(x * SCALE -
# m) with the argument fused (`f32v2mac` onto the pair (-m, -m), loaded
# from SCRATCH by the otherwise idle main slot), stored as f32 into
# SCRATCH and summed in f32 (two interleaved lanes added by `f32v2hsum`,
# then the scalar tail), (3) y = f16(e * recip(sum)) from SCRATCH.
#
# TYPE=32: x and y are f32 (the same state; strides stay multiples of 8,
# elements are 4 bytes, the tail uses `ld32`/`st32`), y = e * recip(sum)
# is stored as f32, and SCRATCH is 4 * COLS + 24 bytes: the pair (-m, -m)
# at +0, a pair the pipeline of pass 2 writes before its first exponential
# at +8, the exponentials from +16. The maximum runs pair-wise
# (`f32v2max`, joined by `f32v2hmax`); the exponentials and sums are those
# of TYPE=16 on the f32 inputs. Over-read (TYPE=32): pass 2 loads the 8
# bytes after a row's last group of four; they must lie in SRAM, their
# values are never used.

        .kernel softmax_rows
        .param TYPE, 16
        .if TYPE != 16 && TYPE != 32
        .error "TYPE must be 16 (f16 rows) or 32 (f32 rows)"
        .endif
        .workers 6
        .if TYPE == 32
        # Per row: 37 issue slots, 14 per group of four (2 in pass 1, 8 in
        # pass 2, 4 in pass 3), 10 per tail element (2 + 5 + 3):
        # 14 * (COLS / 4) + 10 * (COLS % 4) = 10 * COLS - 26 * (COLS / 4).
        .cycles "6 * (8 + ROWS * (37 + 10 * COLS - 26 * (COLS / 4)))"
        .else
        # Per row: 35 issue slots, 18 per group of four, 14 per tail element,
        # written without `%` for the compiler's formula evaluator:
        # 18 * (COLS / 4) + 14 * (COLS % 4) = 14 * COLS - 38 * (COLS / 4).
        .cycles "6 * (7 + ROWS * (35 + 14 * COLS - 38 * (COLS / 4)))"
        .endif

        .equ ST_IN, 0
        .equ ST_RS_IN, 4
        .equ ST_OUT, 8
        .equ ST_RS_OUT, 12
        .equ ST_ROWS, 16
        .equ ST_COLS, 20
        .equ ST_SCALE, 24
        .equ ST_SCRATCH, 28

# Registers: $m2 input row, $m3 output row, $m4 rows left - 1, $m5 groups
# of four per row, $m6 tail elements, $m7 and $m8 walks, $m9 RS_IN, $m10
# RS_OUT, $m11 SCRATCH ((-m, -m) at +0, the exponentials from +8). $a12:13
# SCALE pair, $a10:11 sum pair and later the reciprocal pair, $a3 maximum.

        .text
        .globl softmax_rows
        .entry softmax_rows
softmax_rows:
        ld32 $m2, [$m0 + ST_IN]
        ld32 $m9, [$m0 + ST_RS_IN]
        ld32 $m3, [$m0 + ST_OUT]
        ld32 $m10, [$m0 + ST_RS_OUT]
        ld32 $m4, [$m0 + ST_ROWS]
        add $m4, $m4, -1
        ld32 $m6, [$m0 + ST_COLS]
        shr $m5, $m6, 2
        and $m6, $m6, 3
        ld32 $m11, [$m0 + ST_SCRATCH]
        ld32 $a12, [$m0 + ST_SCALE]
        f32v2bcast $a12:13, $a12
        .if TYPE == 32
        # $m12: the pairs of a row's groups.
        shl $m12, $m5, 1
        .endif
row:
        # Pass 1: maximum of the raw row into $a3. f16: each group's
        # `f16v4hmax` result is folded in by the next group's first bundle
        # (and once after the loop). f32: pair-wise in $a2:3, each bundle
        # folding in the pair that the previous one loaded (and once after
        # the loop), so $a0:1 starts at -inf too.
        mov $m7, $m2
        sethi $a2, 0xFF800
        sethi $a3, 0xFF800
        .if TYPE == 32
        sethi $a0, 0xFF800
        sethi $a1, 0xFF800
        rpt $m12, 1
        { ld64 $a0:1, [$m7]+=8 ; f32v2max $a2:3, $a2:3, $a0:1 }
        f32v2max $a2:3, $a2:3, $a0:1
        f32v2hmax $a3, $a2:3
        rpt $m6, 1
        { ld32 $a0, [$m7]+=4 ; f32max $a3, $a3, $a0 }
        .else
        rpt $m5, 2
        { ld64 $a0:1, [$m7]+=8 ; f32max $a3, $a3, $a2 }
        f16v4hmax $a2, $a0:1
        f32max $a3, $a3, $a2
        rpt $m6, 3
        ld16 $a0, [$m7]+=2
        f16v2tof32 $a0:1, $a0
        .endif
        f32max $a3, $a3, $a0
        f32mul $a3, $a3, $a12
        f32neg $a3, $a3
        f32v2bcast $a14:15, $a3
        st64 $a14:15, [$m11]

        # Pass 2: e = exp(x * SCALE - m) into SCRATCH, summed in f32.
        mov $m7, $m2
        add $m8, $m11, 8
        setzi $a10, 0
        setzi $a11, 0
        setzi $a4, 0
        setzi $a5, 0
        .if TYPE == 32
        # f32, pair by pair: the loop's first bundle loads (-m, -m) as the
        # argument's accumulator and adds the previous pair's e to the sum,
        # the second stores that e and forms the argument of the pair
        # loaded in the third, which also starts the exponential. The first
        # store writes the zero pair $a4:5 at SCRATCH + 8, so the
        # exponentials start at SCRATCH + 16; the last is stored and added
        # after the loop. The walk ran one pair ahead: the tail starts 8
        # bytes back.
        ld64 $a0:1, [$m7]+=8
        rpt $m12, 3
        { ld64 $a2:3, [$m11] ; f32v2add $a10:11, $a10:11, $a4:5 }
        { st64 $a4:5, [$m8]+=8 ; f32v2mac $a2:3, $a0:1, $a12:13 }
        { ld64 $a0:1, [$m7]+=8 ; f32v2exp $a4:5, $a2:3 }
        { st64 $a4:5, [$m8]+=8 ; f32v2add $a10:11, $a10:11, $a4:5 }
        add $m7, $m7, -8
        rpt $m6, 5
        ld32 $a0, [$m7]+=4
        ld32 $a2, [$m11]
        .else
        # f16: the hi pair's add of one group runs in the next group's
        # first bundle (and once after the loop), so $a4:5 starts at zero.
        rpt $m5, 9
        { ld64 $a0:1, [$m7]+=8 ; f32v2add $a10:11, $a10:11, $a4:5 }
        { ld64 $a2:3, [$m11] ; f16v2tof32 $a6:7, $a0 }
        { ld64 $a4:5, [$m11] ; f16v2tof32 $a8:9, $a1 }
        f32v2mac $a2:3, $a6:7, $a12:13
        f32v2mac $a4:5, $a8:9, $a12:13
        f32v2exp $a2:3, $a2:3
        f32v2exp $a4:5, $a4:5
        { st64 $a2:3, [$m8]+=8 ; f32v2add $a10:11, $a10:11, $a2:3 }
        st64 $a4:5, [$m8]+=8
        f32v2add $a10:11, $a10:11, $a4:5
        rpt $m6, 5
        ld16 $a0, [$m7]+=2
        { ld32 $a2, [$m11] ; f16v2tof32 $a0:1, $a0 }
        .endif
        f32mac $a2, $a0, $a12
        f32exp $a2, $a2
        { st32 $a2, [$m8]+=4 ; f32add $a10, $a10, $a2 }
        f32v2hsum $a10, $a10:11
        f32recip $a10, $a10
        f32v2bcast $a10:11, $a10

        .if TYPE == 32
        # Pass 3: y = e * recip(sum), pair by pair, the next pair loaded by
        # the bundle that multiplies the current one (SCRATCH has 8 spare
        # bytes for the last).
        add $m7, $m11, 16
        mov $m8, $m3
        ld64 $a0:1, [$m7]+=8
        rpt $m12, 2
        { ld64 $a0:1, [$m7]+=8 ; f32v2mul $a2:3, $a0:1, $a10:11 }
        st64 $a2:3, [$m8]+=8
        add $m7, $m7, -8
        rpt $m6, 3
        ld32 $a0, [$m7]+=4
        f32mul $a0, $a0, $a10
        st32 $a0, [$m8]+=4
        .else
        # Pass 3: y = f16(e * recip(sum)). The loop loads the next group's
        # low pair ahead (SCRATCH has 8 spare bytes for the last one).
        add $m7, $m11, 8
        mov $m8, $m3
        ld64 $a0:1, [$m7]+=8
        rpt $m5, 5
        { ld64 $a2:3, [$m7]+=8 ; f32v2mul $a0:1, $a0:1, $a10:11 }
        f32v2mul $a2:3, $a2:3, $a10:11
        { ld64 $a0:1, [$m7]+=8 ; f32v2tof16 $a4, $a0:1 }
        f32v2tof16 $a5, $a2:3
        st64 $a4:5, [$m8]+=8
        add $m7, $m7, -8
        rpt $m6, 4
        ld32 $a0, [$m7]+=4
        { setzi $a1, 0 ; f32mul $a0, $a0, $a10 }
        f32v2tof16 $a0, $a0:1
        st16 $a0, [$m8]+=2
        .endif
        add $m2, $m2, $m9
        add $m3, $m3, $m10
        brnzdec $m4, row
        exit
