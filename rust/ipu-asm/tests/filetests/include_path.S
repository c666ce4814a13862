# runs: -I inc | -I inc --name renamed
# `common.inc` is only found through the -I search path.
        .include "common.inc"
        .text
        .entry start
start:  setzi $m0, K + COUNT
        exit
