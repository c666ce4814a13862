        .text
        .include "inc/bad.inc"
