        .text
a:      nop
a:      nop
