        .macro load r, off
        ld32 \r, [$m0 + \off]
        .endm
        .text
        load $m1, 4
        load $m2, undefined_const
