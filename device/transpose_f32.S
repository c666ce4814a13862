# Local transpose of an f32 matrix: out[c, r] = in[r, c] for r < ROWS,
# c < COLS. f32 flash attention needs K^T: the K projection's shard on a
# tile is transposed here before the exchange moves runs of keys (rows of
# K^T) to the attention tiles, as transpose_f16 does for f16. Bits are
# copied, never converted.
#
# Vertex state (u32 words, byte offsets):
#    0 IN     address of in[0, 0] (f32, 4-aligned), either region
#    4 RS_IN  input row stride in bytes (multiple of 4)
#    8 OUT    address of out[0, 0] (f32, 4-aligned), either region; the
#             output must not overlap the input
#   12 RS_OUT output row stride in bytes (multiple of 4)
#   16 ROWS   input rows (>= 1) = elements per output row
#   20 COLS   input columns (>= 1) = output rows
#
# Only the ROWS x COLS output elements are written. As with transpose_f16
# the compiler runs up to six vertices, each on its own column range.
#
# Method: per output row, `ld32` walks down the input column with the
# register stride RS_IN and `st32` writes along the output row: one memory
# access per bundle makes that 2 bundles per element, the bound for 4-byte
# elements that are not known to be 8-aligned.

        .kernel transpose_f32
        .workers 6
        .cycles "6 * (13 + COLS * (4 + 2 * ROWS))"

        .equ ST_IN, 0
        .equ ST_RS_IN, 4
        .equ ST_OUT, 8
        .equ ST_RS_OUT, 12
        .equ ST_ROWS, 16
        .equ ST_COLS, 20

# $m2 RS_IN, $m3 ROWS * RS_IN - 4 (from the end of one input column to the
# top of the next), $m4 RS_OUT - 4 * ROWS (from the end of one output row
# to the start of the next), $m5 ROWS, $m6 columns left - 1, $m7 4 * ROWS,
# $m8 input walk, $m9 output walk.
        .text
        .globl transpose_f32
        .entry transpose_f32
transpose_f32:
        ld32 $m8, [$m0 + ST_IN]
        ld32 $m2, [$m0 + ST_RS_IN]
        ld32 $m9, [$m0 + ST_OUT]
        ld32 $m4, [$m0 + ST_RS_OUT]
        ld32 $m5, [$m0 + ST_ROWS]
        ld32 $m6, [$m0 + ST_COLS]
        mul $m3, $m5, $m2
        add $m3, $m3, -4
        shl $m7, $m5, 2
        sub $m4, $m4, $m7
        add $m6, $m6, -1
column:
        rpt $m5, 2
        ld32 $a0, [$m8]+=$m2
        st32 $a0, [$m9]+=4
        sub $m8, $m8, $m3
        add $m9, $m9, $m4
        brnzdec $m6, column
        exit
