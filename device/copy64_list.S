# `copy64_list`: copy64 over a list of ranges, so that the compiler can give
# each worker an equal share of many buffers' bytes (a device loop's
# per-iteration weight copies, docs/compiler.md "Device loops") in one
# compute set instead of one round of vertices per handful of buffers.
#
# Vertex state (u32 words, byte offsets):
#    0 N      ranges (>= 0)
#    4 INDEX  address of a word k (a device loop's iteration, which the
#             supervisor's rt_loop zeroes and rt_next advances)
#    8 + 16 i, for range i:
#        SRC    address of the first byte to copy (8-aligned) for k = 0
#        STRIDE bytes between the sources of successive k (a multiple of
#               8): the range copies from SRC + k * STRIDE
#        DST    address of the first byte written (8-aligned)
#        BYTES  bytes to copy (a multiple of 8, >= 0)
# Each range is copied as copy64 copies one (the same two paths, chosen per
# range by the same element test), in list order. So one vertex state
# serves every iteration of a loop, each range reading its weight stack's
# slot k.

        .kernel copy64_list
        .workers 6
        # BYTES is the list's total; the fast path, per vertex.
        .cycles "6 * (5 + 33 * N + BYTES / 8)"

        .text
        .globl copy64_list
        .entry copy64_list

        .include "copy_element.inc"

# $m1 ranges left, $m2 the range walk, $m13 the index k; then as copy64: $m4 source walk, $m5
# destination walk, $m6 the (unused) stride register, $m3 the 8-byte
# units, $m7..$m11 keys.
copy64_list:
        ld32 $m1, [$m0 + 0]
        ld32 $m13, [$m0 + 4]
        ld32 $m13, [$m13]
        add $m2, $m0, 8
        brz $m1, list_done
list_range:
        ld32 $m4, [$m2 + 0]
        ld32 $m12, [$m2 + 4]
        mul $m12, $m12, $m13
        add $m4, $m4, $m12
        ld32 $m5, [$m2 + 8]
        ld32 $m3, [$m2 + 12]
        add $m2, $m2, 16
        brz $m3, list_next
        COPY_RANGE list_next
list_next:
        add $m1, $m1, -1
        brnz $m1, list_range
list_done:
        exit
