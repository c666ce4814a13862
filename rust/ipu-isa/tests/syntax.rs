//! Snapshot tests of the assembly syntax: disassembly of a small program and
//! the error messages for bad operands, through one check helper.

use expect_test::{expect, Expect};
use ipu_isa::build::ProgramBuilder;
use ipu_isa::*;

/// Assembles each line alone and prints either its disassembly with the
/// encoded words or the error, one line per input line.
fn check(src: &str, expect: Expect) {
    let mut out = String::new();
    for line in src.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match parse_bundle(line).and_then(|b| encode_bundle(&b).map(|w| (b, w))) {
            Ok((b, words)) => {
                let hex: Vec<String> = words.iter().map(|w| format!("{w:08x}")).collect();
                out.push_str(&format!("{:<20} {b}\n", hex.join(" ")));
            }
            Err(e) => out.push_str(&format!("error: {e}\n")),
        }
    }
    expect.assert_eq(&out);
}

#[test]
fn disassembly_of_valid_lines() {
    check(
        r#"
        setzi $m2, 0x80000
        add $m3, $m3, -4
        mov $m4, $m5
        ld128 $a0:3, [$m2]+=16
        st64 $a4:5, [$m6+$m7]
        { ld2x64st64 $a0:3, $a4:5, $m4, $m7, 0b110100 ; ampf16 $a4:5, $a0:1, $a2:3 }
        { nop ; f16v4mac $a6:7, $a0:1, $a2:3 }
        f32v2exp $a0:1, $a2:3
        f16v4tof8sr $a0, $a2:3, -2
        rpt $m2, 4
        brnzdec $m2, -32
        run $m8, $m9
        xrecv $m1, $m2, $m3, $m4
        get $m0, tile_id
        ret
        "#,
        expect![[r#"
            04280000             setzi $m2, 0x80000
            03330ffc             add $m3, $m3, -4
            0245f004             or $m4, $m5, $mzero
            14024010             ld128 $a0:3, [$m2]+=16
            1b469c00             st64 $a4:5, [$m6+$m7]
            9e044734 50402000    { ld2x64st64 $a0:3, $a4:5, $m4, $m7, 0b110100 ; ampf16 $a4:5, $a0:1, $a2:3 }
            81000000 40602008    { nop ; f16v4mac $a6:7, $a0:1, $a2:3 }
            4102000b             f32v2exp $a0:1, $a2:3
            450204fe             f16v4tof8sr $a0, $a2:3, -2
            27200004             rpt $m2, 4
            242ffff8             brnzdec $m2, -32
            30890000             run $m8, $m9
            36123400             xrecv $m1, $m2, $m3, $m4
            0a000000             get $m0, tile_id
            20e00000             br $lr
        "#]],
    );
}

#[test]
fn errors_name_the_operand_at_fault() {
    check(
        r#"
        ld64 $a1:2, [$m2]
        ld128 $a0:3, [$m2+9000]
        add $m1, $m2, 5000
        setzi $m1, 0x100000
        { ld64 $a0:1, [$m1] ; f16v4add $a0:1, $a2:3, $a4:5 }
        { br -8 ; nop }
        frobnicate $m1
        ampf16 $a0, $a2:3, $a4:5
        ld32 $m1, [$a2]
        "#,
        expect![[r#"
            error: bad operand `$a1:2`: float register ranges are pairs ($a2:3, even first) or quads ($a4:7, first a multiple of 4)
            error: `ld128`: memory immediate 9000 outside -8192..=8191
            error: `add`: immediate 5000 outside -2048..=2047
            error: `setzi`: immediate 0x100000 does not fit 20 unsigned bits
            error: invalid bundle: `ld64 $a0:1, [$m1]` and `f16v4add $a0:1, $a2:3, $a4:5` write the same register
            error: invalid bundle: control instruction `br -8` cannot be bundled
            error: unknown mnemonic `frobnicate`
            error: `ampf16`: operand 1 must be a float register pair ($aN:N+1), got `$a0`
            error: bad operand `[$a2]`: memory base must be an $m register
        "#]],
    );
}

#[test]
fn builder_resolves_labels_with_relocations() {
    let mut b = ProgramBuilder::new(0x4C000);
    b.asm_block(
        "
        setzi $m1, data
        loop:
        brnzdec $m2, loop
        br done
        nop
        done:
        exit
        ",
    )
    .unwrap();
    b.define("data", 0x80010);
    let bytes = b.finish().unwrap();
    let words: Vec<u32> = bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let text: Vec<String> = words
        .iter()
        .map(|w| decode_word(*w).unwrap().to_string())
        .collect();
    assert_eq!(
        text,
        [
            "setzi $m1, 0x80010",
            "brnzdec $m2, +0",
            "br +8",
            "nop",
            "exit"
        ]
    );
    let mut bad = ProgramBuilder::new(0x4C000);
    bad.asm("br nowhere").unwrap();
    assert_eq!(
        bad.finish().unwrap_err().to_string(),
        "undefined symbol `nowhere`"
    );
    assert!(apply_relocation(RelocKind::Abs20, 0, 0, 0x10_0000).is_err());
    assert!(apply_relocation(RelocKind::PcRel20, 0, 0x4C000, 0x4C002).is_err());
}

#[test]
fn disassembly_listing_continues_past_data() {
    let mut b = ProgramBuilder::new(0x4C000);
    b.asm_block("setzi $m1, 5\n{ ld64 $a0:1, [$m1]+=8 ; f16v4add $a2:3, $a0:1, $a0:1 }")
        .unwrap();
    b.word(0);
    b.asm("exit").unwrap();
    let text: Vec<String> = disassemble(&b.finish().unwrap(), 0x4C000)
        .iter()
        .map(|l| l.to_string())
        .collect();
    expect![[r#"
        0x4c000: 04100005           setzi $m1, 0x5
        0x4c004: 93014008 40200000  { ld64 $a0:1, [$m1]+=8 ; f16v4add $a2:3, $a0:1, $a0:1 }
        0x4c00c: 00000000           <illegal instruction word 0x00000000: opcode 0 (zeroed memory) is not an instruction>
        0x4c010: 29000000           exit
    "#]]
    .assert_eq(&(text.join("\n") + "\n"));
}
