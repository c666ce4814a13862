        .text
        { f32add $a0, $a0, $a1 ; ld32 $m1, [$m0] }
