# `copy64`: copies BYTES bytes (a multiple of 8) between 8-aligned buffers.
#
# Vertex state (u32 words, byte offsets):
#    0 SRC    address of the first byte to copy (8-aligned)
#    4 DST    address of the first byte written (8-aligned)
#    8 BYTES  bytes to copy (a multiple of 8, >= 0)
# The copy runs forwards: DST may equal SRC or lie below it, but must not lie
# inside (SRC, SRC + BYTES). When no bundle of it would load and store in
# one memory element (16 KiB standard, 32 KiB interleaved; docs/isa.md),
# the loop is `rpt` over one `ld64st64` (load 8 bytes, store the 8 loaded by
# the bundle before): 1 issue slot per 8 bytes, so six vertices copy 8 B per
# cycle (the store ceiling). Otherwise `ld64st64` would fault (a load and
# the store of one instruction may not hit one element), and the loop is
# `ld64` and `st64` in two bundles: 2 issue slots per 8 bytes. The test is
# COPY_RANGE's (copy_element.inc).

        .kernel copy64
        .workers 6
        # The fast path, per vertex; the slow path takes 6 * (26 + BYTES / 4).
        .cycles "6 * (28 + BYTES / 8)"

        .equ COPY_SRC, 0
        .equ COPY_DST, 4
        .equ COPY_BYTES, 8

        .text
        .globl copy64
        .entry copy64

        .include "copy_element.inc"

# $m4 source walk, $m5 destination walk (consecutive, as `ld64st64` needs),
# $m6 the (unused) stride register, $m3 the 8-byte units; $m7..$m11 keys.
copy64:
        ld32 $m4, [$m0 + COPY_SRC]
        ld32 $m5, [$m0 + COPY_DST]
        ld32 $m3, [$m0 + COPY_BYTES]
        brz $m3, copy_done
        COPY_RANGE copy_done
copy_done:
        exit
