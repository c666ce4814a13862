# `copy64`: copies BYTES bytes (a multiple of 8) between 8-aligned buffers.
#
# Vertex state (u32 words, byte offsets):
#    0 SRC    address of the first byte to copy (8-aligned)
#    4 DST    address of the first byte written (8-aligned)
#    8 BYTES  bytes to copy (a multiple of 8, >= 0)
# The copy runs forwards: DST may equal SRC or lie below it, but must not lie
# inside (SRC, SRC + BYTES). When no memory element (16 KiB standard, 32
# KiB interleaved; docs/isa.md) holds both source and destination bytes,
# the loop is `rpt` over one `ld64st64` (load 8 bytes, store the 8 loaded by
# the bundle before): 1 issue slot per 8 bytes, so six vertices copy 8 B per
# cycle (the store ceiling). Otherwise `ld64st64` would fault (a load and
# the store of one instruction may not hit one element), and the loop is
# `ld64` and `st64` in two bundles: 2 issue slots per 8 bytes.

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

# The element key of the address in \a into \k (\t a temporary): the
# element index, offset by 0x800 for interleaved memory (region 1,
# addresses from 0x80000) so that the two regions never compare equal;
# monotonic in the address.
        .macro ELEMENT k, a, t
        setzi \t, 0x80000
        cmpult \t, \a, \t
        brz \t, elem_r1\@
        shr \k, \a, 14
        br elem_end\@
elem_r1\@:
        shr \k, \a, 15
        or \k, \k, 0x800
elem_end\@:
        .endm

# $m4 source walk, $m5 destination walk (consecutive, as `ld64st64` needs),
# $m6 the (unused) stride register, $m3 the 8-byte units; $m7..$m11 keys.
copy64:
        ld32 $m4, [$m0 + COPY_SRC]
        ld32 $m5, [$m0 + COPY_DST]
        ld32 $m3, [$m0 + COPY_BYTES]
        brz $m3, copy_done
        # Element keys of the first and last byte of both buffers; the fast
        # path needs the two key ranges disjoint.
        add $m12, $m4, $m3
        add $m12, $m12, -1
        ELEMENT $m7, $m4, $m11
        ELEMENT $m8, $m12, $m11
        add $m12, $m5, $m3
        add $m12, $m12, -1
        ELEMENT $m9, $m5, $m11
        ELEMENT $m10, $m12, $m11
        shr $m3, $m3, 3
        cmpult $m11, $m8, $m9
        brnz $m11, copy_fast
        cmpult $m11, $m10, $m7
        brnz $m11, copy_fast
        rpt $m3, 2
        ld64 $a0:1, [$m4]+=8
        st64 $a0:1, [$m5]+=8
        exit
copy_fast:
        ld64 $a0:1, [$m4]+=8
        add $m3, $m3, -1
        rpt $m3, 1
        ld64st64 $a0:1, $a0:1, $m4, $m6, 0
        st64 $a0:1, [$m5]+=8
copy_done:
        exit
