        .param K
        .text
        nop
