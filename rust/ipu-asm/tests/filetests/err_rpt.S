        .text
        rpt 3, 2
        nop
        br done
done:   exit
