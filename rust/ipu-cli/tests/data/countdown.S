# A supervisor program that counts down from 100 and exits: the smallest
# program that exercises the assembler, the linker and `ipu sim` together.
        .text
        .globl main
        .entry main
main:
        setzi $m1, 100
loop:
        brnzdec $m1, loop
        exit
