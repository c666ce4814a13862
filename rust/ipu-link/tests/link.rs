//! Linker tests: an end-to-end two-object program checked by disassembling
//! the image with ipu-isa, relocations of each kind, dead-section removal,
//! placement options, and every error kind (exact text snapshots).

use expect_test::{expect, Expect};
use ipu_link::{link, Input, LinkOptions};
use ipu_object::{Object, RegionConstraint, TileImage};
use std::path::Path;

fn asm(name: &str, text: &str) -> Input {
    let out = ipu_asm::assemble_source(name, text, Path::new("."), &ipu_asm::Options::default())
        .unwrap_or_else(|e| panic!("{e}"));
    Input {
        name: name.to_string(),
        object: out.object,
    }
}

/// Disassembles every code symbol's range of the image, plus data words.
fn disassemble(img: &TileImage) -> String {
    let mut out = String::new();
    let mut syms: Vec<_> = img.symbols.iter().collect();
    syms.sort_by_key(|(_, s)| s.address);
    for (name, s) in syms {
        out.push_str(&format!(
            "{name} @ {:#x} ({:?}, {} bytes)\n",
            s.address, s.kind, s.size
        ));
        let bytes = img
            .bytes_at(s.address, s.size)
            .expect("symbol bytes in the image");
        let mut off = 0;
        while off < bytes.len() {
            if s.kind == ipu_object::SymbolKind::Function {
                let (b, n) = ipu_isa::decode_bundle_bytes(&bytes[off..]).expect("code decodes");
                out.push_str(&format!("  {:#x}: {b}\n", s.address as usize + off));
                off += n;
            } else {
                let w = u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap());
                out.push_str(&format!(
                    "  {:#x}: .word {w:#x}\n",
                    s.address as usize + off
                ));
                off += 4;
            }
        }
    }
    out
}

const MAIN: &str = "
        .text
        .globl main
main:   setzi $m0, table
        ld32 $m1, [$m0]
        call helper
        br done
done:   exit
        .data
        .globl table
table:  .word helper, counter + 4
        .size table, 8
";

const LIB: &str = "
        .section .text.helper, code
        .globl helper
helper: setzi $m2, counter
        ret
        .section .text.unused, code
        .globl unused
unused: call nowhere
        ret
        .section .data.counter, data, region=1
        .globl counter
counter: .word 0, 0
";

#[test]
fn end_to_end_two_objects() {
    let inputs = [asm("main.S", MAIN), asm("lib.S", LIB)];
    let linked = link(&inputs, &LinkOptions::new("main")).unwrap_or_else(|e| panic!("{e}"));
    // The image survives its own format.
    let bytes = linked.image.to_bytes().unwrap();
    assert_eq!(TileImage::from_bytes(&bytes).unwrap(), linked.image);
    expect![[r#"
        main @ 0x4c000 (Function, 20 bytes)
          0x4c000: setzi $m0, 0x4c020
          0x4c004: ld32 $m1, [$m0]
          0x4c008: call +12
          0x4c00c: br +4
          0x4c010: exit
        helper @ 0x4c014 (Function, 8 bytes)
          0x4c014: setzi $m2, 0x80000
          0x4c018: br $lr
        table @ 0x4c020 (Data, 8 bytes)
          0x4c020: .word 0x4c014
          0x4c024: .word 0x80004
        counter @ 0x80000 (Data, 8 bytes)
          0x80000: .word 0x0
          0x80004: .word 0x0
    "#]]
    .assert_eq(&disassemble(&linked.image));
    expect![[r#"
        # ipu-ld map (ipu-toolchain 0.1.1)
        entry main 0x4c000

        sections:
          0x4c000      20 code standard    main.S(.text)
          0x4c014       8 code standard    lib.S(.text.helper)
          0x4c020       8 data standard    main.S(.data)
          0x80000       8 data interleaved lib.S(.data.counter)

        discarded:
          lib.S(.text.unused) 8 bytes

        symbols:
          0x4c000      20 main
          0x4c014       8 helper
          0x4c020       8 table
          0x80000       8 counter

        usage:
          standard    36 of 212992 bytes
          interleaved 8 of 425984 bytes
    "#]]
    .assert_eq(&linked.map());
}

fn err(inputs: &[Input], opts: &LinkOptions, want: Expect) {
    match link(inputs, opts) {
        Ok(_) => panic!("link should fail"),
        Err(e) => want.assert_eq(&e.to_string()),
    }
}

#[test]
fn dead_sections_hide_their_undefined_symbols_until_kept() {
    let inputs = [asm("main.S", MAIN), asm("lib.S", LIB)];
    let mut opts = LinkOptions::new("main");
    opts.keep.push("unused".into());
    err(
        &inputs,
        &opts,
        expect!["undefined symbol `nowhere` referenced from lib.S(.text.unused) at offset 0x0"],
    );
    let mut opts = LinkOptions::new("main");
    opts.gc_sections = false;
    err(
        &inputs,
        &opts,
        expect!["undefined symbol `nowhere` referenced from lib.S(.text.unused) at offset 0x0"],
    );
}

#[test]
fn placement_options() {
    let inputs = [asm("main.S", MAIN), asm("lib.S", LIB)];
    let mut opts = LinkOptions::new("main");
    opts.base = 0x50000;
    opts.data_base = Some(0x60000);
    opts.interleaved_base = 0x90000;
    let l = link(&inputs, &opts).unwrap();
    let addr = |n: &str| l.image.symbol(n).unwrap();
    assert_eq!(
        (addr("main"), addr("helper"), addr("table"), addr("counter")),
        (0x50000, 0x50014, 0x60000, 0x90000)
    );
    // The relocated words follow the placement.
    assert_eq!(
        l.image.bytes_at(0x60000, 8).unwrap(),
        [0x14, 0, 5, 0, 4, 0, 9, 0]
    );
    opts.data_base = Some(0x50010);
    err(&inputs, &opts, expect!["region 0 (code and standard data) [0x50000, 0x5001c) overlaps data area at 0x50010 [0x50010, 0x50018)"]);
    opts.data_base = None;
    opts.base = 0x90000;
    err(
        &inputs,
        &opts,
        expect!["--base 0x90000: must lie in Standard memory [0x4c000, 0x80000)"],
    );
}

#[test]
fn error_kinds() {
    let main = asm("main.S", MAIN);
    err(
        std::slice::from_ref(&main),
        &LinkOptions::new("main"),
        expect!["undefined symbol `helper` referenced from main.S(.text) at offset 0x8"],
    );
    err(
        std::slice::from_ref(&main),
        &LinkOptions::new("start"),
        expect!["entry symbol `start` is not defined by any object (or is not global)"],
    );
    let dup = asm("dup.S", ".text\n.globl helper\nhelper: ret\n");
    err(
        &[main.clone(), asm("lib.S", LIB), dup],
        &LinkOptions::new("main"),
        expect!["duplicate symbol `helper`: defined in lib.S and in dup.S"],
    );
    let big = asm(
        "big.S",
        ".text\n.globl main\nmain: setzi $m0, w1\nsetzi $m0, w2\nexit\n.section .bss.w1, bss, region=1\nw1: .space 300000\n.section .bss.w2, bss, region=1\nw2: .space 200000\n",
    );
    err(&[big], &LinkOptions::new("main"), expect!["region 1 (interleaved) overflows: 500000 bytes needed, 425984 available; largest sections: big.S(.bss.w1) 300000 bytes; big.S(.bss.w2) 200000 bytes;"]);
    let far = asm(
        "far.S",
        ".text\n.globl main\nmain: setzi $m0, main + 0x100000\nexit\n",
    );
    err(&[far], &LinkOptions::new("main"), expect!["relocation Abs20 at far.S(.text)+0x0 to `main` (value 0x14c000): relocation Abs20 with value 0x14c000: does not fit 20 unsigned bits"]);
    let odd = asm(
        "odd.S",
        ".text\n.globl main\nmain: call other + 2\nexit\n.section .text.o, code\nother: ret\n",
    );
    err(&[odd], &LinkOptions::new("main"), expect!["relocation PcRel20 at odd.S(.text)+0x0 to `other` (value 0x4c00a): relocation PcRel20 with value 0x4c00a: target is not 4-byte aligned"]);
    // A hand-edited object whose code asks for region 1.
    let mut bad = asm("bad.S", ".text\n.globl main\nmain: exit\n");
    bad.object.sections[0].region = RegionConstraint::Interleaved;
    err(&[bad], &LinkOptions::new("main"), expect!["code section bad.S(.text) requests region 1, but instructions are fetched from region 0 only"]);
    // Code whose words do not decode (zeroed memory is illegal).
    let mut junk = asm("junk.S", ".text\n.globl main\nmain: nop\nexit\n");
    junk.object.sections[0].bytes[0..4].copy_from_slice(&[0, 0, 0, 0]);
    err(&[junk], &LinkOptions::new("main"), expect!["code section junk.S(.text) at offset 0x0 does not decode after relocation: illegal instruction word 0x00000000: opcode 0 (zeroed memory) is not an instruction"]);
    err(&[], &LinkOptions::new("main"), expect!["no input objects"]);
    let _ = Object::default();
}
