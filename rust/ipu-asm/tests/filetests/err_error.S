        .param K, 24
        .if K % 16
        .error "K must be a multiple of 16"
        .endif
