# Fill the same 8-byte items of many equally spaced rows with one pair of
# words: the head padding of the K rows that transposed attention streams
# through the AMP (each key row holds its head's columns and then zero
# padding up to the next 16 columns; the buffer is scratch that an earlier
# phase of the run used, so the padding must be rewritten every run, and a
# list of ranges as in fill64.S would need one range per row).
#
# Vertex state (u32 words, byte offsets):
#    0 ADDR   first item of row 0 (8-aligned, any region)
#    4 STRIDE bytes from one row's first item to the next (multiple of 8)
#    8 ROWS   rows (>= 1)
#   12 ITEMS  items per row (>= 1)
#   16 LO     word stored at ADDR + r * STRIDE + 8j
#   20 HI     word stored at ADDR + r * STRIDE + 8j + 4
#
# The compiler gives every worker its own vertex on a range of rows.

        .kernel fill_rows
        .workers 6
        .cycles "6 * (8 + ROWS * (5 + ITEMS))"

# $m2 row start, $m3 items, $m4 stride, $m5 rows left - 1, $m6 item walk.
        .text
        .globl fill_rows
        .entry fill_rows
fill_rows:
        ld32 $m2, [$m0 + 0]
        ld32 $m4, [$m0 + 4]
        ld32 $m5, [$m0 + 8]
        add $m5, $m5, -1
        ld32 $m3, [$m0 + 12]
        ld32 $a0, [$m0 + 16]
        ld32 $a1, [$m0 + 20]
row:
        mov $m6, $m2
        rpt $m3, 1
        st64 $a0:1, [$m6]+=8
        add $m2, $m2, $m4
        brnzdec $m5, row
        exit
