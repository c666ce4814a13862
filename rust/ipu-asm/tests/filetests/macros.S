# runs: | -D K=64 | -D K=12
# Macros with defaults and \@ labels, .rept, .if/.elseif/.else, .include.
        .include "inc/common.inc"
        .macro addk d, s, k=1
        add \d, \s, \k
        .endm
        .macro spin r
.Lspin\@:
        brnzdec \r, .Lspin\@
        .endm

        .text
f:
        addk $m1, $m1
        addk $m2, $m2, K * 2
        spin $m3
        spin $m4
        .rept 3
        nop
        .endr
        .if K > 32
        setzi $m5, 1
        .elseif K > 8
        setzi $m5, 2
        .else
        setzi $m5, 3
        .endif
        .ifdef MISSING
        setzi $m6, 6
        .endif
        .ifndef MISSING
        setzi $m6, 7
        .endif
        rpt 4, 2
        { nop ; f32add $a0, $a0, $a1 }
        f32mul $a2, $a2, $a3
        exit
