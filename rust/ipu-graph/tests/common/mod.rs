//! The one check helper shared by the data-driven graph tests.

use std::path::{Path, PathBuf};

/// The crate directory: absolute under cargo, relative to the working directory
/// under Bazel; canonicalised so that snapshot paths are absolute either way.
pub fn crate_dir() -> PathBuf {
    let dir = std::env::var("CARGO_MANIFEST_DIR")
        .expect("CARGO_MANIFEST_DIR is set by cargo and by the Bazel rule");
    std::fs::canonicalize(&dir).unwrap_or_else(|e| panic!("{dir}: {e}"))
}

/// Runs the pipeline on one `.ipug` text: parse, verify, print, re-parse and
/// compare, then summarise. Returns the text the snapshot holds.
pub fn run(display_name: &str, text: &str) -> String {
    match ipu_graph::parse(display_name, text) {
        Err(e) => format!("{e}\n"),
        Ok(graph) => {
            if let Err(errors) = ipu_graph::verify(&graph) {
                panic!("{display_name}: the parser built a graph the verifier rejects: {errors:?}");
            }
            let printed = ipu_graph::print(&graph);
            let reparsed = ipu_graph::parse(display_name, &printed).unwrap_or_else(|e| {
                panic!("{display_name}: the printed graph does not parse: {e}\n{printed}")
            });
            assert_eq!(
                reparsed, graph,
                "{display_name}: parse(print(g)) != g\n{printed}"
            );
            assert_eq!(
                ipu_graph::print(&reparsed),
                printed,
                "{display_name}: printing is not idempotent"
            );
            format!("{printed}---\n{}", ipu_graph::summary(&graph))
        }
    }
}

/// Checks every `.ipug` file in `dir` (relative to the crate) against the
/// snapshot `<stem>.out` in `snapshots` (relative to the crate).
#[allow(dead_code)] // Used by filetests.rs, not by models.rs.
pub fn check_dir(dir: &str, snapshots: &str) {
    check_files(
        &crate_dir().join(dir),
        &crate_dir().join("tests").join(snapshots),
        dir,
    )
}

/// Checks every `.ipug` file in `inputs` against `<stem>.out` in `snapshots`;
/// error messages name files as `label/<file>` so snapshots do not depend on
/// the machine.
pub fn check_files(inputs: &Path, snapshots: &Path, label: &str) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(inputs)
        .unwrap_or_else(|e| panic!("{}: {e}", inputs.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "ipug"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no .ipug files", inputs.display());
    for path in files {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let actual = run(&format!("{label}/{name}"), &text);
        let snapshot = snapshots.join(path.with_extension("out").file_name().unwrap());
        expect_test::expect_file![snapshot].assert_eq(&actual);
    }
}
