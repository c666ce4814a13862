"""local_crate_mirror: loaded by cargo-bazel's defs.bzl; used only for local path crates, which this project has none of."""

def _local_crate_mirror_impl(rctx):
    fail("local_crate_mirror is not supported: this project pins only registry crates")

local_crate_mirror = repository_rule(
    implementation = _local_crate_mirror_impl,
    attrs = {"options_json": attr.string(), "path": attr.string()},
)
