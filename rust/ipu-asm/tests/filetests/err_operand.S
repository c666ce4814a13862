        .text
        add $m1, $m2, $m99
