# Element-wise cast of a contiguous run of N elements between f32, f16 and
# fp8 (F143 with a power-of-two scale, docs/isa.md and ipu_isa::numerics).
#
# Specialisations (-D, integers):
#   FROM, TO  formats: 32 (f32), 16 (f16), 8 (fp8 F143); the pairs 32->16,
#             16->32, 16->8, 8->16, 32->8 and 8->32
#   SR        0 (default): round to nearest even; 1: stochastic rounding
#             (32->16 and 16->8 only: the ISA has `f32v2tof16sr` and
#             `f16v4tof8sr` but no stochastic f32 -> fp8 conversion, and two
#             stochastic roundings in a row do not have the right distribution)
#   SCALE     the fp8 scale s (default 0, -64..64): an fp8 code c stands for
#             F143(c) * 2^s, so x -> fp8 is F143(x * 2^-s) and fp8 -> x is
#             F143(c) * 2^s. It is a parameter, not state, because the ISA's
#             conversions take the scale as an immediate.
#
# Results are bit-identical to ipu_isa::numerics (and ipu_reference::fp8):
#   32->16  f64_to_f16_bits(x) (NaN -> 0x7E00, overflow -> inf)
#   16->32  exact
#   16->8   f64_to_f8(x, s) (saturating to +-240 * 2^s, NaN -> 0x80, -0 -> 0)
#   8->16   f64_to_f16_bits(F143(c) * 2^s)
#   32->8   f64_to_f8(x, s): one rounding from f32 (see below)
#   8->32   F143(c) * 2^s exactly (NaN -> the canonical f32 NaN)
#
# Vertex state (u32 words, byte offsets):
#    0 IN       address of element 0 (8-aligned, any region)
#    4 OUT      address of element 0 of the result (8-aligned, any region;
#               must not overlap IN unless it equals IN and the output
#               element is not wider than the input)
#    8 N        elements (>= 0)
#   12 SEED_LO  SR=1 only: the low and high words of the PRNG seed set with
#   16 SEED_HI  `setseed` at the start, so that the rounding of a vertex
#               does not depend on which worker context runs it
#
# Groups of four elements take the vector path; the N % 4 tail elements
# follow. The tail of an fp8 output is merged into its 32-bit word (the ISA
# has no byte store): the bytes after element N - 1 keep their values, but
# the vertex owns that word. The tail of an fp8 or f16 input reads the
# whole 4- or 8-byte word holding it (never past that word). Workers take
# ranges whose starts keep IN and OUT 8-aligned (multiples of 8 elements
# for fp8).
#
# 32->8 without double rounding: y = x * 2^-s (exact in f32 for these
# scales, or far beyond fp8's range), h = f16(y) nearest even, then h is
# forced to an odd f16 code towards y when h != y (round to odd). An odd f16
# code is never an fp8 midpoint (fp8 midpoints have 5 significant bits,
# f16 codes 11), so the final nearest-even `f16v4tof8` sees the same side of
# every midpoint as y does. h != y and its side are found in f32: p =
# (y - f32(h)) * y is > 0 when |y| > |h| (move h up by one code: h | 1) and
# < 0 when |y| < |h| (move down: (h - 1) | 1); an f16 overflow to infinity
# moves down to 65504, which saturates like y; an infinite or NaN y gives a
# NaN p and leaves h alone. The masks of the comparisons are packed to f16
# lanes (`pack16lo`) and applied in integer registers.

        .kernel cast
        .param FROM, 16
        .param TO, 32
        .param SR, 0
        .param SCALE, 0
        .workers 6
        .if !((FROM == 32 && TO == 16) || (FROM == 16 && TO == 32) || (FROM == 16 && TO == 8) || (FROM == 8 && TO == 16) || (FROM == 32 && TO == 8) || (FROM == 8 && TO == 32))
        .error "FROM and TO must be two different formats among 32 (f32), 16 (f16) and 8 (fp8 F143)"
        .endif
        .if SR != 0 && SR != 1
        .error "SR must be 0 (nearest even) or 1 (stochastic)"
        .endif
        .if SR == 1 && !((FROM == 32 && TO == 16) || (FROM == 16 && TO == 8))
        .error "SR=1 exists for FROM=32 TO=16 and FROM=16 TO=8 only (no stochastic f32 -> fp8 conversion in the ISA)"
        .endif
        .if SCALE < -64 || SCALE > 64
        .error "SCALE must be in -64..64"
        .endif
        .if SCALE != 0 && FROM != 8 && TO != 8
        .error "SCALE applies to fp8 only (FROM=8 or TO=8)"
        .endif

        # Per vertex, in issue slots: the fixed part plus G = N / 4 groups
        # and T = N % 4 tail elements (`%` written as N - 4 * (N / 4)); the
        # tail's bundles by how many elements it has, [T >= k] written as
        # (T + 4 - k) / 4. Exact counts on the paths with at least one
        # group (none: 2 bundles fewer).
        .if FROM == 32 && TO == 16 && SR == 0
        .cycles "6 * (12 + 3 * (N / 4) + 3 * (N - 4 * (N / 4)))"
        .elseif FROM == 32 && TO == 16
        .cycles "6 * (15 + 3 * (N / 4) + 3 * (N - 4 * (N / 4)))"
        .elseif FROM == 16 && TO == 32
        .cycles "6 * (11 + 3 * (N / 4) + 3 * (N - 4 * (N / 4)))"
        .elseif FROM == 16 && TO == 8 && SR == 0
        .cycles "6 * (11 + 2 * (N / 4) + 13 * (((N - 4 * (N / 4)) + 3) / 4))"
        .elseif FROM == 16 && TO == 8
        .cycles "6 * (14 + 2 * (N / 4) + 13 * (((N - 4 * (N / 4)) + 3) / 4))"
        .elseif FROM == 8 && TO == 16
        .cycles "6 * (11 + 2 * (N / 4) + 5 * (((N - 4 * (N / 4)) + 3) / 4) + 4 * (((N - 4 * (N / 4)) + 2) / 4) + (((N - 4 * (N / 4)) + 1) / 4))"
        .elseif FROM == 8 && TO == 32 && SCALE == 0
        .cycles "6 * (9 + 5 * (N / 4) + 7 * (((N - 4 * (N / 4)) + 3) / 4) + 3 * (((N - 4 * (N / 4)) + 2) / 4) + (((N - 4 * (N / 4)) + 1) / 4))"
        .elseif FROM == 8 && TO == 32
        .cycles "6 * (11 + 7 * (N / 4) + 9 * (((N - 4 * (N / 4)) + 3) / 4) + 3 * (((N - 4 * (N / 4)) + 2) / 4) + (((N - 4 * (N / 4)) + 1) / 4))"
        .elseif SCALE == 0
        .cycles "6 * (12 + 39 * (N / 4) + 50 * (((N - 4 * (N / 4)) + 3) / 4) + (((N - 4 * (N / 4)) + 1) / 4))"
        .else
        .cycles "6 * (14 + 41 * (N / 4) + 52 * (((N - 4 * (N / 4)) + 3) / 4) + (((N - 4 * (N / 4)) + 1) / 4))"
        .endif

        .equ ST_IN, 0
        .equ ST_OUT, 4
        .equ ST_N, 8
        .equ ST_SEED_LO, 12
        .equ ST_SEED_HI, 16

# Registers: $m2 input walk, $m3 output walk, $m4 groups, $m5 tail
# elements, $m6 groups - 1, $m7..$m10 integer temporaries, $m11 the lane
# constant 0x00010001 (32->8).

# Merges the low $m5 (1..3) bytes of \src into the word at [$m3].
        .macro MERGE_BYTES src
        mov $m7, \src
        ld32 $m8, [$m3]
        shl $m9, $m5, 3
        setzi $m10, 1
        shl $m10, $m10, $m9
        sub $m9, $mzero, $m10
        add $m10, $m10, -1
        and $m7, $m7, $m10
        and $m8, $m8, $m9
        or $m7, $m7, $m8
        st32 $m7, [$m3]
        .endm

# 32->8: the round-to-odd fix of the f16 pair \h (a single register holding
# two lanes) from the f32 pair \y; $a4:5 and $a6:7 temporaries, $a10 and
# $a11 the packed masks, $a14:15 zero.
        .macro ODD_ARITH h, y
        f32v2tof16 \h, \y
        f16v2tof32 $a4:5, \h
        f32v2sub $a4:5, \y, $a4:5
        f32v2mul $a4:5, $a4:5, \y
        f32v2cmplt $a6:7, $a14:15, $a4:5
        pack16lo $a10, $a6, $a7
        f32v2cmplt $a6:7, $a4:5, $a14:15
        pack16lo $a11, $a6, $a7
        .endm
        .macro ODD_INT h
        mov $m7, \h
        mov $m8, $a10
        mov $m9, $a11
        or $m8, $m8, $m9
        and $m8, $m8, $m11
        and $m9, $m9, $m11
        sub $m7, $m7, $m9
        or $m7, $m7, $m8
        mov \h, $m7
        .endm
# One group of four f32 in $a0:1, $a2:3 to four fp8 bytes in $a4.
        .macro F32_TO_F8_GROUP
        .if SCALE != 0
        f32v2mul $a0:1, $a0:1, $a8:9
        f32v2mul $a2:3, $a2:3, $a8:9
        .endif
        ODD_ARITH $a12, $a0:1
        ODD_INT $a12
        ODD_ARITH $a13, $a2:3
        ODD_INT $a13
        f16v4tof8 $a4, $a12:13, 0
        .endm

        .text
        .globl cast
        .entry cast
cast:
        ld32 $m2, [$m0 + ST_IN]
        ld32 $m3, [$m0 + ST_OUT]
        ld32 $m5, [$m0 + ST_N]
        .if SR
        ld32 $m7, [$m0 + ST_SEED_LO]
        ld32 $m8, [$m0 + ST_SEED_HI]
        setseed $m7, $m8
        .endif
        shr $m4, $m5, 2
        and $m5, $m5, 3
        add $m6, $m4, -1

        .if FROM == 32 && TO == 16
        # 3 bundles per group: the hi pair of a group converts in the next
        # group's first bundle and the pair is stored in its second.
        brz $m4, tail
        ld64 $a0:1, [$m2]+=8
        .if SR
        f32v2tof16sr $a4, $a0:1
        .else
        f32v2tof16 $a4, $a0:1
        .endif
        ld64 $a2:3, [$m2]+=8
        rpt $m6, 3
        .if SR
        { ld64 $a0:1, [$m2]+=8 ; f32v2tof16sr $a5, $a2:3 }
        { st64 $a4:5, [$m3]+=8 ; f32v2tof16sr $a4, $a0:1 }
        .else
        { ld64 $a0:1, [$m2]+=8 ; f32v2tof16 $a5, $a2:3 }
        { st64 $a4:5, [$m3]+=8 ; f32v2tof16 $a4, $a0:1 }
        .endif
        ld64 $a2:3, [$m2]+=8
        .if SR
        f32v2tof16sr $a5, $a2:3
        .else
        f32v2tof16 $a5, $a2:3
        .endif
        st64 $a4:5, [$m3]+=8
tail:
        # One conversion per element (lane 1 is discarded; with SR it still
        # draws its random number).
        rpt $m5, 3
        ld32 $a0, [$m2]+=4
        .if SR
        f32v2tof16sr $a4, $a0:1
        .else
        f32v2tof16 $a4, $a0:1
        .endif
        st16 $a4, [$m3]+=2
        exit

        .elseif FROM == 16 && TO == 32
        # 3 bundles per group: the hi pair of a group is stored by the next
        # group's second bundle.
        brz $m4, tail
        ld64 $a0:1, [$m2]+=8
        f16v2tof32 $a4:5, $a0
        { st64 $a4:5, [$m3]+=8 ; f16v2tof32 $a6:7, $a1 }
        rpt $m6, 3
        ld64 $a0:1, [$m2]+=8
        { st64 $a6:7, [$m3]+=8 ; f16v2tof32 $a4:5, $a0 }
        { st64 $a4:5, [$m3]+=8 ; f16v2tof32 $a6:7, $a1 }
        st64 $a6:7, [$m3]+=8
tail:
        rpt $m5, 3
        ld16 $a0, [$m2]+=2
        f16v2tof32 $a4:5, $a0
        st32 $a4, [$m3]+=4
        exit

        .elseif FROM == 16 && TO == 8
        # 2 bundles per group: each group's four bytes are stored by the
        # next group's second bundle.
        brz $m4, tail
        ld64 $a0:1, [$m2]+=8
        .if SR
        f16v4tof8sr $a4, $a0:1, SCALE
        .else
        f16v4tof8 $a4, $a0:1, SCALE
        .endif
        rpt $m6, 2
        ld64 $a0:1, [$m2]+=8
        .if SR
        { st32 $a4, [$m3]+=4 ; f16v4tof8sr $a4, $a0:1, SCALE }
        .else
        { st32 $a4, [$m3]+=4 ; f16v4tof8 $a4, $a0:1, SCALE }
        .endif
        st32 $a4, [$m3]+=4
tail:
        # The tail's 8-byte word converts whole (four random numbers with
        # SR); its first N % 4 bytes are merged into the output word.
        brz $m5, done
        ld64 $a0:1, [$m2]
        .if SR
        f16v4tof8sr $a4, $a0:1, SCALE
        .else
        f16v4tof8 $a4, $a0:1, SCALE
        .endif
        MERGE_BYTES $a4
done:
        exit

        .elseif FROM == 8 && TO == 16
        # 2 bundles per group: each group's pair is stored by the next
        # group's second bundle.
        brz $m4, tail
        ld32 $a0, [$m2]+=4
        f8v4tof16 $a4:5, $a0, SCALE
        rpt $m6, 2
        ld32 $a0, [$m2]+=4
        { st64 $a4:5, [$m3]+=8 ; f8v4tof16 $a4:5, $a0, SCALE }
        st64 $a4:5, [$m3]+=8
tail:
        brz $m5, done
        ld32 $a0, [$m2]
        f8v4tof16 $a4:5, $a0, SCALE
        st16 $a4, [$m3]+=2
        add $m5, $m5, -1
        brz $m5, done
        pack16hi $a6, $a4, $a4
        st16 $a6, [$m3]+=2
        add $m5, $m5, -1
        brz $m5, done
        st16 $a5, [$m3]+=2
done:
        exit

        .elseif FROM == 8 && TO == 32
        # fp8 -> f16 without scale is exact (every F143 value is an f16),
        # f16 -> f32 is exact and the scale is an exact f32 multiplication.
        .if SCALE != 0
        sethi $a12, (127 + SCALE) << 11
        f32v2bcast $a12:13, $a12
        .endif
        .if SCALE != 0
        rpt $m4, 7
        .else
        rpt $m4, 5
        .endif
        ld32 $a0, [$m2]+=4
        f8v4tof16 $a4:5, $a0, 0
        f16v2tof32 $a8:9, $a4
        .if SCALE != 0
        f16v2tof32 $a10:11, $a5
        f32v2mul $a8:9, $a8:9, $a12:13
        { st64 $a8:9, [$m3]+=8 ; f32v2mul $a10:11, $a10:11, $a12:13 }
        .else
        { st64 $a8:9, [$m3]+=8 ; f16v2tof32 $a10:11, $a5 }
        .endif
        st64 $a10:11, [$m3]+=8
        brz $m5, done
        ld32 $a0, [$m2]
        f8v4tof16 $a4:5, $a0, 0
        f16v2tof32 $a8:9, $a4
        f16v2tof32 $a10:11, $a5
        .if SCALE != 0
        f32v2mul $a8:9, $a8:9, $a12:13
        f32v2mul $a10:11, $a10:11, $a12:13
        .endif
        st32 $a8, [$m3]+=4
        add $m5, $m5, -1
        brz $m5, done
        st32 $a9, [$m3]+=4
        add $m5, $m5, -1
        brz $m5, done
        st32 $a10, [$m3]+=4
done:
        exit

        .else
        # 32 -> 8: $a8:9 the pair 2^-SCALE, $m11 the lane constant.
        .if SCALE != 0
        sethi $a8, (127 - SCALE) << 11
        f32v2bcast $a8:9, $a8
        .endif
        setzi $m11, 1
        shl $m10, $m11, 16
        or $m11, $m11, $m10
        brz $m4, tail
group:
        ld64 $a0:1, [$m2]+=8
        ld64 $a2:3, [$m2]+=8
        F32_TO_F8_GROUP
        st32 $a4, [$m3]+=4
        brnzdec $m6, group
tail:
        # The tail elements load as one or two pairs (the rest zero).
        brz $m5, done
        mov64 $a2:3, $a14:15
        ld64 $a0:1, [$m2]
        cmpult $m7, $m5, 3
        brnz $m7, tail_loaded
        ld32 $a2, [$m2 + 8]
tail_loaded:
        F32_TO_F8_GROUP
        MERGE_BYTES $a4
done:
        exit
        .endif
