        .section .text.fast, code, region=1
