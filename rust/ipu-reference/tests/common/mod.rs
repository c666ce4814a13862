//! Helpers shared by the reference's integration tests.

use std::path::PathBuf;

/// A model file from the repository's `models/` directory (found through
/// CARGO_MANIFEST_DIR, which cargo and the Bazel rule both set).
pub fn model(name: &str) -> ipu_graph::Graph {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR is set");
    let path = PathBuf::from(dir).join("../../models").join(name);
    ipu_graph::parse_file(&path).unwrap_or_else(|e| panic!("{e}"))
}
