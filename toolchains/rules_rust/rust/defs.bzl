"""Public Rust rules, with the rules_rust names and attributes that cargo-bazel's generated files use."""

load("//rust/private:rust.bzl", _rust_binary = "rust_binary", _rust_library = "rust_library", _rust_proc_macro = "rust_proc_macro", _rust_test = "rust_test")
load("//rust:rust_common.bzl", _BuildInfo = "BuildInfo", _CrateInfo = "CrateInfo")

rust_library = _rust_library
rust_proc_macro = _rust_proc_macro
rust_binary = _rust_binary
rust_test = _rust_test
CrateInfo = _CrateInfo
BuildInfo = _BuildInfo
