        .text
        .equ FAR, 4 * (1 << 19)
        br FAR
