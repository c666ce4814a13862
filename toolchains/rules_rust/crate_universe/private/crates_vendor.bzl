"""crates_vendor_remote_repository: the hub repository of remote-mode vendored crates."""

def _crates_vendor_remote_repository_impl(rctx):
    rctx.symlink(rctx.attr.build_file, "BUILD.bazel")
    if rctx.attr.defs_module:
        rctx.symlink(rctx.attr.defs_module, "defs.bzl")
    rctx.file("WORKSPACE.bazel", "workspace(name = \"%s\")\n" % rctx.name)

crates_vendor_remote_repository = repository_rule(
    implementation = _crates_vendor_remote_repository_impl,
    attrs = {
        "build_file": attr.label(mandatory = True),
        "defs_module": attr.label(),
    },
)
