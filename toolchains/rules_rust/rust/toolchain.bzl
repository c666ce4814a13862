"""rust_toolchain: the rustc that the Rust rules run, found through toolchain resolution."""

def _rust_toolchain_impl(ctx):
    rustc = ctx.file.rustc
    # The sysroot is the directory above bin/rustc; rustc is always given it
    # explicitly so that it never looks beyond the declared inputs.
    sysroot = rustc.dirname.rsplit("/", 1)[0]
    all_files = depset([rustc], transitive = [depset(ctx.files.rustc_lib), depset(ctx.files.rust_std)])
    return [platform_common.ToolchainInfo(
        rust = struct(
            rustc = rustc,
            sysroot = sysroot,
            all_files = all_files,
            version = ctx.attr.version,
            target_triple = ctx.attr.target_triple,
        ),
    )]

rust_toolchain = rule(
    implementation = _rust_toolchain_impl,
    attrs = {
        "rustc": attr.label(allow_single_file = True, mandatory = True),
        "rustc_lib": attr.label_list(allow_files = True),
        "rust_std": attr.label_list(allow_files = True),
        "version": attr.string(mandatory = True),
        "target_triple": attr.string(mandatory = True),
    },
)
