        .macro r
        r
        .endm
        r
