# Fill ranges of 8-byte items, each with its own pair of words: the
# compiler's per-run initialisation of state that kernels accumulate into
# (flash attention's O = 0 and its (m, l) = (-inf, 0) pairs) and of padding
# that GEMMs multiply, in memory that an earlier phase of the run used.
# A vertex takes a list of ranges so that the compiler can give every
# worker an equal share of the items, whatever the ranges' sizes.
#
# Vertex state (u32 words, byte offsets):
#    0 N      ranges (>= 1)
#    4 + 16 i, for range i:
#        ADDR  first item (8-aligned, any region)
#        COUNT items (>= 0)
#        LO    word stored at ADDR + 8j
#        HI    word stored at ADDR + 8j + 4

        .kernel fill64
        .workers 6
        .cycles "6 * (3 + 8 * N + COUNT)"

        .text
        .globl fill64
        .entry fill64
fill64:
        ld32 $m6, [$m0 + 0]
        add $m7, $m0, 4
range:
        ld32 $m2, [$m7 + 0]
        ld32 $m3, [$m7 + 4]
        ld32 $a0, [$m7 + 8]
        ld32 $a1, [$m7 + 12]
        rpt $m3, 1
        st64 $a0:1, [$m2]+=8
        add $m7, $m7, 16
        add $m6, $m6, -1
        brnz $m6, range
        exit
