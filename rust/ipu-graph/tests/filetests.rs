//! Data-driven filetests: every `tests/filetests/*.ipug` is parsed and the
//! outcome (the canonical print and analysis summary, or the error message) is
//! compared with the snapshot `<name>.out` beside it. Run with
//! `UPDATE_EXPECT=1` to rewrite the snapshots after an intended change.

mod common;

#[test]
fn filetests() {
    common::check_dir("tests/filetests", "filetests");
}
