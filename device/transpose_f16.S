# Local transpose of an f16 matrix: out[c, r] = in[r, c] for r < ROWS,
# c < COLS. The compiler needs K^T for flash attention: the K projection's
# shard on a tile is transposed here before the exchange moves runs of keys
# (rows of K^T) to the attention tiles. Bits are copied, never converted.
#
# Vertex state (u32 words, byte offsets):
#    0 IN     address of in[0, 0] (f16, 2-aligned), either region
#    4 RS_IN  input row stride in bytes (even)
#    8 OUT    address of out[0, 0] (f16, 2-aligned), either region; the
#             output must not overlap the input
#   12 RS_OUT output row stride in bytes (even)
#   16 ROWS   input rows (>= 1) = elements per output row
#   20 COLS   input columns (>= 1) = output rows
#
# Only the ROWS x COLS output elements are written (row padding is left
# alone). There is no worker-index split inside the vertex: the compiler
# runs up to six vertices, each on its own column range c0..c1, with
# IN + 2 * c0, OUT + c0 * RS_OUT and COLS = c1 - c0.
#
# Method. The ISA has one memory access per bundle, and neither the input
# columns nor the output rows are guaranteed to be more than 2-aligned, so
# the kernel reads each element with ld16 (walking down an input column
# with the register stride RS_IN) and writes an output row in 8-byte
# stores wherever it can: per output row, up to three leading elements
# (until the output pointer is 8-aligned) and the last (ROWS - head) % 4
# elements take ld16 + st16 (2 bundles each); the rest goes in groups of
# four as four ld16, two pack16lo on the idle arithmetic slot and one st64
# (5 bundles per 4 elements). The group loop is software pipelined: the
# iteration that loads group g+1 packs the second half of group g and
# stores it, so every register is read before it is overwritten.
#
# Cycles (per vertex, tile cycles, output rows 8-aligned so head = 0):
# 12 bundles of entry and exit, per column 16 bundles of bookkeeping
# (alignment split, pipeline fill and drain, pointer updates), 5 per group
# of four and 2 per tail element. Misaligned output rows cost up to 3
# bundles more per column (one group fewer, up to 4 more single elements).

        .kernel transpose_f16
        .workers 6
        .cycles "6 * (12 + COLS * (16 + 5 * (ROWS / 4) + 2 * (ROWS - 4 * (ROWS / 4))))"

        .equ ST_IN, 0
        .equ ST_RS_IN, 4
        .equ ST_OUT, 8
        .equ ST_RS_OUT, 12
        .equ ST_ROWS, 16
        .equ ST_COLS, 20

# $m2 RS_IN, $m3 ROWS * RS_IN - 2 (from the end of one input column to the
# top of the next), $m4 RS_OUT - 2 * ROWS (from the end of one output row
# to the start of the next), $m5 ROWS, $m6 columns left - 1, $m8 input walk,
# $m9 output walk, $m10 head elements, $m11 groups of four, $m12 tail
# elements. $a0..$a3 one group's elements, $a4:5 its packed pair.
        .text
        .globl transpose_f16
        .entry transpose_f16
transpose_f16:
        ld32 $m8, [$m0 + ST_IN]
        ld32 $m2, [$m0 + ST_RS_IN]
        ld32 $m9, [$m0 + ST_OUT]
        ld32 $m4, [$m0 + ST_RS_OUT]
        ld32 $m5, [$m0 + ST_ROWS]
        ld32 $m6, [$m0 + ST_COLS]
        mul $m3, $m5, $m2
        add $m3, $m3, -2
        sub $m4, $m4, $m5
        sub $m4, $m4, $m5
        add $m6, $m6, -1
column:
        # head = min(((-out) & 7) / 2, ROWS) elements bring the output
        # walk to an 8-byte boundary; then groups of four; then the tail.
        sub $m10, $mzero, $m9
        and $m10, $m10, 6
        shr $m10, $m10, 1
        min $m10, $m10, $m5
        sub $m11, $m5, $m10
        and $m12, $m11, 3
        shr $m11, $m11, 2
        rpt $m10, 2
        ld16 $a0, [$m8]+=$m2
        st16 $a0, [$m9]+=2
        brz $m11, tail
        # Pipeline fill: load group 0 and pack its first half.
        ld16 $a0, [$m8]+=$m2
        ld16 $a1, [$m8]+=$m2
        { ld16 $a2, [$m8]+=$m2 ; pack16lo $a4, $a0, $a1 }
        ld16 $a3, [$m8]+=$m2
        add $m11, $m11, -1
        # Iteration g loads group g+1 and stores group g ($a4 was packed
        # in iteration g-1 or the fill, $a5 in this iteration's first
        # bundle from the $a2, $a3 of group g).
        rpt $m11, 5
        { ld16 $a0, [$m8]+=$m2 ; pack16lo $a5, $a2, $a3 }
        ld16 $a1, [$m8]+=$m2
        st64 $a4:5, [$m9]+=8
        { ld16 $a2, [$m8]+=$m2 ; pack16lo $a4, $a0, $a1 }
        ld16 $a3, [$m8]+=$m2
        # Drain: the last group.
        pack16lo $a5, $a2, $a3
        st64 $a4:5, [$m9]+=8
tail:
        rpt $m12, 2
        ld16 $a0, [$m8]+=$m2
        st16 $a0, [$m9]+=2
        sub $m8, $m8, $m3
        add $m9, $m9, $m4
        brnzdec $m6, column
        exit
