# A small vertex: directives, labels, bundles, relocations.
        .kernel scale_f16
        .param N, 64
        .workers 6
        .cycles "20 + 6 * ceil(N/4)"
        .equ STATE_IN, 0
        .equ STATE_OUT, 4

        .text
        .globl scale
        .entry scale
scale:
        ld32 $m2, [$m0 + STATE_IN]
        ld32 $m3, [$m0 + STATE_OUT]
        setzi $m4, N / 4 - 1
        setzi $m5, table
loop:   { ld64 $a0:1, [$m2]+=8 ; f16v4mul $a2:3, $a0:1, $a4:5 }
        st64 $a2:3, [$m3]+=8
        brnzdec $m4, loop
        call helper
        exit

        .data
        .align 8
table:  .word 1, -1, 0x7fffffff, scale + 4
        .half 1, 2
        .byte 'a', 255
        .float 1.5, -0.25
        .f16 1.0
        .zero 3
        .space 2, 0xAB

        .bss
buf:    .space 64
