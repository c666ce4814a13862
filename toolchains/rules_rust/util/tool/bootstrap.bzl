"""Builds the std-only rules_rust_tool with rustc directly (it cannot wrap itself)."""

def _rust_bootstrap_binary_impl(ctx):
    toolchain = ctx.toolchains["@rules_rust//rust:toolchain_type"].rust
    out = ctx.actions.declare_file(ctx.label.name)
    # A shell is needed only here, to learn the working directory for
    # --remap-path-prefix; every other Rust action gets it from this tool.
    ctx.actions.run_shell(
        command = ('exec "$1" "$2" --crate-name=rules_rust_tool --crate-type=bin --edition=2021 ' +
                   '--sysroot="$3" -Copt-level=2 -Cdebuginfo=0 --remap-path-prefix="$PWD"=. -o "$4"'),
        arguments = [toolchain.rustc.path, ctx.file.src.path, toolchain.sysroot, out.path],
        inputs = depset([ctx.file.src], transitive = [toolchain.all_files]),
        outputs = [out],
        mnemonic = "RustcBootstrap",
        progress_message = "Compiling Rust bootstrap tool %s" % ctx.label,
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), executable = out)]

rust_bootstrap_binary = rule(
    implementation = _rust_bootstrap_binary_impl,
    attrs = {"src": attr.label(allow_single_file = [".rs"], mandatory = True)},
    executable = True,
    toolchains = ["@rules_rust//rust:toolchain_type"],
)
