        .equ A, (3 + 4
