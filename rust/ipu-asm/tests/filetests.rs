//! Data-driven assembler filetests (rust-analyzer style): every
//! `tests/filetests/*.S` is assembled and the outcome (object listing and
//! metadata, or the exact error text) is compared with the snapshot
//! `<name>.out` beside it. A first line `# runs: ARGS | ARGS ...` assembles
//! the file once per argument set (`-D NAME=VALUE`, `--name N`, `-I DIR` relative to the file), which is how
//! specialisation is tested. Run with `UPDATE_EXPECT=1` to rewrite snapshots.

use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    let dir =
        std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR is set by cargo and Bazel");
    std::fs::canonicalize(&dir).unwrap_or_else(|e| panic!("{dir}: {e}"))
}

/// The one check helper: assembles `path` with `args` and renders the result.
fn check_one(path: &Path, args: &str) -> String {
    let mut opts = ipu_asm::Options::default();
    let mut words = args.split_whitespace();
    while let Some(w) = words.next() {
        match w {
            "-D" => {
                let (k, v) =
                    ipu_asm::parse_define(words.next().expect("-D needs a value")).unwrap();
                opts.defines.insert(k, v);
            }
            "--name" => opts.name = words.next().map(String::from),
            "-I" => opts.include_dirs.push(
                path.parent()
                    .unwrap()
                    .join(words.next().expect("-I needs a directory")),
            ),
            other => panic!("{}: unknown filetest argument {other}", path.display()),
        }
    }
    let root = crate_dir().join("tests").display().to_string();
    match ipu_asm::assemble_file(path, &opts) {
        Ok(out) => {
            // The object must survive its own binary format unchanged, and
            // assembling twice must give identical bytes.
            let bytes = out.object.to_bytes().expect("valid object");
            let back = ipu_object::Object::from_bytes(&bytes).expect("object reads back");
            assert_eq!(back, out.object, "{}: object round trip", path.display());
            let again = ipu_asm::assemble_file(path, &opts).unwrap();
            assert_eq!(
                again.object.to_bytes().unwrap(),
                bytes,
                "{}: not deterministic",
                path.display()
            );
            let files: Vec<String> = out
                .files
                .iter()
                .map(|f| f.display().to_string().replace(&root, "$TESTS"))
                .collect();
            format!(
                "{}---\nfiles: {}\n{}",
                ipu_object::dump_object(&out.object),
                files.join(", "),
                out.metadata.to_json()
            )
        }
        Err(e) => format!("{}\n", e.to_string().replace(&root, "$TESTS")),
    }
}

#[test]
fn filetests() {
    let dir = crate_dir().join("tests/filetests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "S"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "filetests missing");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let runs: Vec<String> = match text.lines().next().and_then(|l| l.strip_prefix("# runs:")) {
            Some(r) => r.split('|').map(|s| s.trim().to_string()).collect(),
            None => vec![String::new()],
        };
        let mut actual = String::new();
        for args in &runs {
            if runs.len() > 1 {
                actual.push_str(&format!("=== args: {args}\n"));
            }
            actual.push_str(&check_one(&path, args));
        }
        expect_test::expect_file![path.with_extension("out")].assert_eq(&actual);
    }
}
