        .text
        .word 5
