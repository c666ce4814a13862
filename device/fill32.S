# `fill32`: writes one 32-bit value into N words, at the store rate of one
# worker (one 8-byte `st64` per issue slot; six vertices store 8 B/cycle,
# the machine model's store ceiling).
#
# Vertex state (u32 words, byte offsets):
#    0 DST    address of word 0 (4-aligned, any region)
#    4 N      words (>= 0)
#    8 VALUE  the 32-bit value (any bits: an f32, two f16, four fp8 codes)
# A DST that is 4 but not 8 mod 8 gets one `st32` first, then `st64` pairs,
# then one `st32` if a word is left: no byte outside the N words is written.

        .kernel fill32
        .workers 6
        .cycles "6 * (12 + N / 2)"

        .equ FILL_DST, 0
        .equ FILL_N, 4
        .equ FILL_VALUE, 8

        .text
        .globl fill32
        .entry fill32

# $m2 destination walk, $m3 words left; $a0:1 the value pair.
fill32:
        ld32 $m2, [$m0 + FILL_DST]
        ld32 $m3, [$m0 + FILL_N]
        ld32 $a0, [$m0 + FILL_VALUE]
        ld32 $a1, [$m0 + FILL_VALUE]
        brz $m3, fill_done
        and $m4, $m2, 4
        brz $m4, fill_pairs
        st32 $a0, [$m2]+=4
        add $m3, $m3, -1
fill_pairs:
        shr $m4, $m3, 1
        rpt $m4, 1
        st64 $a0:1, [$m2]+=8
        and $m3, $m3, 1
        brz $m3, fill_done
        st32 $a0, [$m2]
fill_done:
        exit

