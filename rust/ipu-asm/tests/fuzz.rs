//! The assembler on random and mutated text: it must return an object or an
//! error, never panic or hang. Inputs are the filetest sources with lines
//! deleted, duplicated, swapped and spliced with syntax fragments, and lines
//! made of random fragments, from a seeded PRNG.

use std::path::PathBuf;

use ipu_rng::SplitMix64 as Rng;

const FRAGMENTS: &[&str] = &[
    ".if",
    ".else",
    ".elseif",
    ".endif",
    ".ifdef K",
    ".macro m a",
    ".endm",
    "m 1",
    "m",
    ".rept 3",
    ".endr",
    ".include \"inc/common.inc\"",
    ".include \"nope\"",
    "\\a",
    "\\@",
    "{",
    "}",
    ";",
    "[",
    "]",
    "]+=",
    "$m",
    "$a0:3",
    "$m15",
    "0x",
    "0xffffffffffffffff",
    "-",
    "(",
    ")",
    "<<",
    ",",
    ":",
    "\"",
    "x:",
    ".text",
    ".data",
    ".bss",
    ".section .q, region=1",
    ".word",
    ".half",
    ".byte",
    ".float",
    ".space 4",
    ".align 8",
    ".equ E, 1",
    ".set E, E+1",
    ".globl g",
    ".entry g",
    "g:",
    "call g",
    "br g",
    "setzi $m0, g",
    "rpt 2, 1",
    "nop",
    "exit",
    "ld32 $m1, [$m0+E]",
    ".error \"x\"",
    ".param P, 2",
    ".workers 7",
    ".cycles \"1\"",
    ".size g, 4",
    "1/0",
    "é",
    "\t",
    "# c",
    "//",
];

#[test]
fn mutated_sources_never_panic() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("tests/filetests");
    let mut sources: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "S"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    sources.sort();
    let opts = ipu_asm::Options::default();
    let mut rng = Rng(42);
    let (mut ok, mut err) = (0, 0);
    for round in 0..3000 {
        let base = &sources[round % sources.len()];
        let mut lines: Vec<String> = base.lines().map(String::from).collect();
        for _ in 0..1 + rng.index(4) {
            let n = lines.len();
            match rng.index(6) {
                0 if n > 0 => {
                    lines.remove(rng.index(n));
                }
                1 if n > 0 => {
                    let l = lines[rng.index(n)].clone();
                    lines.insert(rng.index(n + 1), l);
                }
                2 if n > 1 => {
                    let (a, b) = (rng.index(n), rng.index(n));
                    lines.swap(a, b);
                }
                3 if n > 0 => {
                    // Splice a fragment into a line at a character boundary.
                    let i = rng.index(n);
                    let cut = lines[i]
                        .char_indices()
                        .map(|(k, _)| k)
                        .nth(rng.index(lines[i].chars().count() + 1))
                        .unwrap_or(lines[i].len());
                    let frag = FRAGMENTS[rng.index(FRAGMENTS.len())];
                    lines[i].insert_str(cut, frag);
                }
                _ => {
                    let mut l = String::new();
                    for _ in 0..1 + rng.index(5) {
                        l.push_str(FRAGMENTS[rng.index(FRAGMENTS.len())]);
                        l.push(' ');
                    }
                    lines.insert(rng.index(n + 1), l);
                }
            }
        }
        let text = lines.join("\n");
        match ipu_asm::assemble_source("fuzz.S", &text, &dir, &opts) {
            Ok(a) => {
                ok += 1;
                // Whatever assembles must serialise and read back.
                let bytes = a
                    .object
                    .to_bytes()
                    .expect("the assembler only builds valid objects");
                assert_eq!(ipu_object::Object::from_bytes(&bytes).unwrap(), a.object);
            }
            Err(e) => {
                err += 1;
                assert!(e.to_string().contains(": error: "), "{e}");
            }
        }
    }
    assert!(ok > 100 && err > 100, "ok {ok}, err {err}");
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(7);
    let opts = ipu_asm::Options::default();
    for _ in 0..2000 {
        let len = rng.index(200);
        let text: String = (0..len)
            .map(|_| {
                let pool = b"abcxyz019$[]{}();,:.+-*/%<>=!~&|^\\\"'# \n\tmK@";
                pool[rng.index(pool.len())] as char
            })
            .collect();
        let _ = ipu_asm::assemble_source("random.S", &text, std::path::Path::new("."), &opts);
    }
}
