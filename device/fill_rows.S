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

# The loop runs over items outside and rows inside: one `rpt` bundle per
# row and item, the row stride as a register post-increment.

        .kernel fill_rows
        .workers 6
        .cycles "6 * (10 + ITEMS * (6 + ROWS))"

# $m2 item 0 of row 0 plus 8 per item done, $m3 items left - 1, $m4
# stride, $m5 rows, $m6 row walk.
        .text
        .globl fill_rows
        .entry fill_rows
fill_rows:
        ld32 $m2, [$m0 + 0]
        ld32 $m4, [$m0 + 4]
        ld32 $m5, [$m0 + 8]
        ld32 $m3, [$m0 + 12]
        add $m3, $m3, -1
        ld32 $a0, [$m0 + 16]
        ld32 $a1, [$m0 + 20]
item:
        mov $m6, $m2
        rpt $m5, 1
        st64 $a0:1, [$m6]+=$m4
        add $m2, $m2, 8
        brnzdec $m3, item
        exit
