# `supervisor`: the device-side runtime of a compiled package. It is every
# tile's supervisor program: the command loop of docs/host-protocol.md and an
# interpreter of the tile's *program table*, which the compiler emits as data
# (symbol `rt_program`, format in docs/runtime.md, "The supervisor runtime").
#
# The table is direct-threaded: every record starts with the address of the
# handler below that executes it, so the interpreter has no decode step; a
# handler reads its operands with post-incremented loads through the cursor
# $m13 and ends with `br` to the next record's handler. The handlers are
# straight-line code (one per group size), because a loop would cost a
# branch per vertex and the supervisor issues only one bundle every 6 cycles.
#
# Every handler exists in two variants. `_w` ("wait") first waits for the
# workers that the previous records started (`wsync`); the plain variant
# assumes either that no worker runs (after the dispatch or an exchange) or,
# for a compute group, that it continues the same compute set. The compiler
# picks the variant; its verifier checks that nothing but a compute group
# follows a compute group without waiting. A `_w` handler does all its loads
# *before* the `wsync`: while workers run, those bundles cost nothing,
# because the supervisor issues in the slots of workers that have exited.
#
# Registers (supervisor context; workers get their own):
#   $m0  rt_program                 $m11 command word address
#   $m1, $m2  scratch, `xtab` operands   $m12 checkpoint flag (bit 31 of the command)
#   $m3  next handler               $m13 program-table cursor
#   $m4  vertex entry               $m5..$m10 vertex states of a group
#
# Records (u32 words; the cursor points just after the handler word when a
# handler starts):
#   rt_runN[_w], N = 1..6: entry, state_1 .. state_N
#       start N vertices of one entry (`run` each; a seventh vertex of a
#       compute set waits in `run` until a worker is free)
#   rt_exchange[_w]: table address, descriptor count
#       `sync`, then `xtab` exactly at T0 + 12 as ipu-exchange schedules it
#       (two loads between `sync` and `xtab` take the place of the standard
#       prologue's two `setzi`), then `xend`
#   rt_stop[_w]: (nothing)
#       a checkpoint stop: `hsync` only when the command had bit 31 set
#   rt_host[_w]: (nothing)
#       a host stop: `hsync` on every run; the host writes the stop's
#       inputs (docs/host-protocol.md, "Host stops")
#   rt_end[_w]: (nothing)
#       end of the call: back to the idle `hsync`
#   rt_loop: COUNT, COUNTER, INDEX
#       a device loop starts (docs/runtime.md): COUNT into the record's
#       own COUNTER word, zero into the word at address INDEX (the loop's
#       index, from which copy64_list vertices pick their weight-stack
#       slots); workers that run on are not waited for
#   rt_next: INDEX, DELTA, COUNTER, BODY
#       the end of the loop's body: DELTA added to the word at INDEX,
#       the word at COUNTER decremented, and while it is not zero the next
#       record is the one at BODY (the body's first); must follow a record
#       after which no worker runs (an exchange)
#
# Table header (at rt_program):
#    0 COMMAND  address of the command word (manifest.host.command_address)
#    4 CALLS    number of calls
#    8 ...      CALLS words: the address of each call's first record

        .kernel supervisor

        .equ RT_COMMAND, 0
        .equ RT_CALLS, 4
        .equ RT_CALL_LIST, 8
        # 0xFFFFFFFF ends the session; see docs/host-protocol.md.

        .text
        .entry rt_main
        .globl rt_run1, rt_run2, rt_run3, rt_run4, rt_run5, rt_run6
        .globl rt_run1_w, rt_run2_w, rt_run3_w, rt_run4_w, rt_run5_w, rt_run6_w
        .globl rt_exchange, rt_exchange_w, rt_stop, rt_stop_w, rt_end, rt_end_w
        .globl rt_host, rt_host_w
        .globl rt_loop, rt_next

rt_main:
        setzi $m0, rt_program
        ld32 $m11, [$m0 + RT_COMMAND]
        # Falls through rt_end_w: a `wsync` with no worker running costs one
        # bundle, once per session.
rt_end_w:
        wsync
rt_end:
rt_idle:
        hsync
        ld32 $m2, [$m11]
        add $m1, $m2, 1
        brz $m1, rt_exit
        shr $m12, $m2, 31
        # Bit 31 is the checkpoint flag; the call index is the rest.
        shl $m2, $m2, 1
        shr $m2, $m2, 1
        ld32 $m1, [$m0 + RT_CALLS]
        cmpult $m1, $m2, $m1
        # An unknown call ends the program, as the exit command does: the
        # host sees the tile stop instead of a call that silently does
        # nothing.
        brz $m1, rt_exit
        shl $m2, $m2, 2
        add $m2, $m2, RT_CALL_LIST
        ld32 $m13, [$m0 + $m2]
        ld32 $m3, [$m13]+=4
        br $m3
rt_exit:
        exit

# A group of N vertices of one entry (N = 1..6, state registers $m5 ..).
#
# With `wait`, everything is loaded before the `wsync` (in the shadow of the
# previous compute set) and the `run`s follow back to back after it, one
# every two issue slots (12 cycles per vertex). Without `wait` nothing is
# hidden, so each state is loaded just before its `run` (18 cycles per
# vertex, the first `run` 12 cycles after the handler starts); the next
# handler is loaded after the last `run`, while the workers run.
        .macro RUN_GROUP n, wait
        ld32 $m4, [$m13]+=4
        .if \wait
        .if \n >= 1
        ld32 $m5, [$m13]+=4
        .endif
        .if \n >= 2
        ld32 $m6, [$m13]+=4
        .endif
        .if \n >= 3
        ld32 $m7, [$m13]+=4
        .endif
        .if \n >= 4
        ld32 $m8, [$m13]+=4
        .endif
        .if \n >= 5
        ld32 $m9, [$m13]+=4
        .endif
        .if \n >= 6
        ld32 $m10, [$m13]+=4
        .endif
        ld32 $m3, [$m13]+=4
        wsync
        .if \n >= 1
        run $m4, $m5
        .endif
        .if \n >= 2
        run $m4, $m6
        .endif
        .if \n >= 3
        run $m4, $m7
        .endif
        .if \n >= 4
        run $m4, $m8
        .endif
        .if \n >= 5
        run $m4, $m9
        .endif
        .if \n >= 6
        run $m4, $m10
        .endif
        .else
        .rept \n
        ld32 $m5, [$m13]+=4
        run $m4, $m5
        .endr
        ld32 $m3, [$m13]+=4
        .endif
        br $m3
        .endm

rt_run1_w:
        RUN_GROUP 1, 1
rt_run2_w:
        RUN_GROUP 2, 1
rt_run3_w:
        RUN_GROUP 3, 1
rt_run4_w:
        RUN_GROUP 4, 1
rt_run5_w:
        RUN_GROUP 5, 1
rt_run6_w:
        RUN_GROUP 6, 1
rt_run1:
        RUN_GROUP 1, 0
rt_run2:
        RUN_GROUP 2, 0
rt_run3:
        RUN_GROUP 3, 0
rt_run4:
        RUN_GROUP 4, 0
rt_run5:
        RUN_GROUP 5, 0
rt_run6:
        RUN_GROUP 6, 0

# An exchange step. The next handler is loaded before the `sync` (in the
# shadow of running workers for the `_w` variant); after `sync` exactly two
# bundles precede `xtab`, so it issues at T0 + 12, the issue offset the
# tables were scheduled for (ipu_exchange::lower::XTAB_ISSUE_OFFSET). The
# second load steps the cursor over the next record's handler word.
        .macro EXCHANGE wait
        ld32 $m3, [$m13 + 8]
        .if \wait
        wsync
        .endif
        sync
        ld32 $m1, [$m13]+=4
        ld32 $m2, [$m13]+=8
        xtab $m1, $m2
        xend
        br $m3
        .endm

rt_exchange_w:
        EXCHANGE 1
rt_exchange:
        EXCHANGE 0

# A checkpoint stop (docs/runtime.md, `checkpoints.json`): the host reads
# intermediate values at an extra `hsync` only in a checkpoint run.
        .macro STOP wait, skip
        ld32 $m3, [$m13]+=4
        .if \wait
        wsync
        .endif
        brz $m12, \skip
        hsync
\skip:
        br $m3
        .endm

rt_stop_w:
        STOP 1, rt_stop_w_skip
rt_stop:
        STOP 0, rt_stop_skip

# A host stop (docs/host-protocol.md, "Host stops"): an `hsync` on every
# run, at which the host writes the inputs of the stop, such as a device
# loop's weights for its next iteration, and resumes the device.
        .macro HOST wait
        ld32 $m3, [$m13]+=4
        .if \wait
        wsync
        .endif
        hsync
        br $m3
        .endm

rt_host_w:
        HOST 1
rt_host:
        HOST 0

# A device loop (docs/runtime.md, "Device loops"). The loop's state lives
# in memory (the COUNTER word of its rt_loop record, the INDEX word), so
# the handlers keep no register across records and loops cost the table
# two records whatever their count.
rt_loop:
        ld32 $m1, [$m13 + 0]
        ld32 $m2, [$m13 + 8]
        ld32 $m3, [$m13 + 12]
        st32 $m1, [$m13 + 4]
        st32 $m15, [$m2]
        add $m13, $m13, 16
        br $m3

rt_next:
        ld32 $m2, [$m13 + 0]
        ld32 $m1, [$m13 + 4]
        ld32 $m4, [$m2]
        add $m4, $m4, $m1
        st32 $m4, [$m2]
        ld32 $m2, [$m13 + 8]
        ld32 $m1, [$m2]
        add $m1, $m1, -1
        st32 $m1, [$m2]
        brz $m1, rt_next_out
        ld32 $m13, [$m13 + 12]
        ld32 $m3, [$m13]+=4
        br $m3
rt_next_out:
        ld32 $m3, [$m13 + 16]
        add $m13, $m13, 20
        br $m3
