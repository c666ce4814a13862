# Fill COUNT 8-byte items with one pair of words: the compiler's per-run
# initialisation of state that a kernel accumulates into (flash attention's
# O = 0 and its (m, l) = (-inf, 0) pairs), which must be reset before every
# run call because the previous call left its own values there.
#
# Vertex state (u32 words, byte offsets):
#    0 ADDR   first item (8-aligned, any region)
#    4 COUNT  items (>= 0)
#    8 LO     word stored at ADDR + 8i
#   12 HI     word stored at ADDR + 8i + 4

        .kernel fill64
        .workers 6
        .cycles "6 * (6 + COUNT)"

        .equ ST_ADDR, 0
        .equ ST_COUNT, 4
        .equ ST_LO, 8
        .equ ST_HI, 12

        .text
        .globl fill64
        .entry fill64
fill64:
        ld32 $m2, [$m0 + ST_ADDR]
        ld32 $m3, [$m0 + ST_COUNT]
        ld32 $a0, [$m0 + ST_LO]
        ld32 $a1, [$m0 + ST_HI]
        rpt $m3, 1
        st64 $a0:1, [$m2]+=8
        exit
