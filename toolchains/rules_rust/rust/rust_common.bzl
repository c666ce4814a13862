"""Providers shared by the Rust rules."""

CrateInfo = provider(
    doc = "A compiled Rust crate and what a dependant needs to use it.",
    fields = {
        "name": "str: the crate name as rustc sees it",
        "type": "str: rlib, proc-macro or bin",
        "output": "File: the .rlib, .so or executable",
        "transitive_outputs": "depset[File]: this crate's output and every crate it depends on",
        "dep_env": "File or None: DEP_<links>_* variables from this crate's build script",
        "data": "depset[File]: runfiles that dependants' binaries and tests need",
        # What rust_test(crate = ...) needs to recompile the crate with --test.
        "root": "File: the crate root",
        "srcs": "depset[File]: all sources and compile data",
        "deps": "list[CrateInfo]: direct dependencies",
        "proc_macro_deps": "list[CrateInfo]: direct proc-macro dependencies",
        "build_infos": "list[BuildInfo]: build-script results of this crate",
        "edition": "str",
        "features": "list[str]",
        "rustc_flags": "list[str]",
        "rustc_env": "dict[str, str]",
        "rustc_env_files": "list[File]",
        "version": "str",
        "package_name": "str: the Cargo package name (CARGO_PKG_NAME)",
    },
)

BuildInfo = provider(
    doc = "The result of running a Cargo build script.",
    fields = {
        "out_dir": "File: the OUT_DIR tree",
        "flags": "File: rustc arguments, one per line, paths under ${pwd}",
        "env": "File: KEY=VALUE lines for rustc's environment",
        "dep_env": "File: DEP_<links>_KEY=VALUE lines for dependants' build scripts",
    },
)

COMMON_PROVIDERS = [CrateInfo, DefaultInfo]
