        .include "missing.inc"
