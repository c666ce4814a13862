"""cargo_build_script and cargo_toml_env_vars, as cargo-bazel's generated BUILD files use them."""

load("//rust:defs.bzl", "rust_binary")
load("//rust:rust_common.bzl", "BuildInfo", "CrateInfo")

def _cargo_build_script_run_impl(ctx):
    toolchain = ctx.toolchains["@rules_rust//rust:toolchain_type"].rust
    out_dir = ctx.actions.declare_directory(ctx.label.name + ".out_dir")
    flags = ctx.actions.declare_file(ctx.label.name + ".flags")
    env = ctx.actions.declare_file(ctx.label.name + ".env")
    dep_env = ctx.actions.declare_file(ctx.label.name + ".depenv")
    manifest_dir = "/".join([p for p in [ctx.label.workspace_root, ctx.label.package] if p]) or "."

    args = ctx.actions.args()
    args.add("build-script")
    args.add("--script", ctx.executable.script)
    args.add("--manifest-dir", manifest_dir)
    args.add("--out-dir", out_dir.path)
    args.add("--rustc", toolchain.rustc)
    args.add("--flags-out", flags)
    args.add("--env-out", env)
    args.add("--dep-env-out", dep_env)
    args.add("--pkg-name", ctx.attr.pkg_name or ctx.label.name)
    args.add("--version", ctx.attr.version or "0.0.0")
    if ctx.attr.links:
        args.add("--links", ctx.attr.links)
    args.add_all(ctx.attr.crate_features, before_each = "--feature")
    dep_env_files = []
    for dep in ctx.attr.link_deps:
        if CrateInfo in dep and dep[CrateInfo].dep_env:
            dep_env_files.append(dep[CrateInfo].dep_env)
    args.add_all(dep_env_files, before_each = "--dep-env-file")
    for key in sorted(ctx.attr.build_script_env.keys()):
        args.add("--env", "%s=%s" % (key, ctx.expand_location(ctx.attr.build_script_env[key], ctx.attr.data + ctx.attr.tools)))

    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = depset(
            ctx.files.data + ctx.files.compile_data + dep_env_files,
            transitive = [toolchain.all_files],
        ),
        tools = [ctx.attr.script[DefaultInfo].files_to_run] + [t[DefaultInfo].files_to_run for t in ctx.attr.tools],
        outputs = [out_dir, flags, env, dep_env],
        mnemonic = "CargoBuildScriptRun",
        progress_message = "Running Cargo build script %s" % (ctx.attr.pkg_name or ctx.label),
        use_default_shell_env = True,
    )
    return [
        BuildInfo(out_dir = out_dir, flags = flags, env = env, dep_env = dep_env),
        DefaultInfo(files = depset([out_dir])),
    ]

_cargo_build_script_run = rule(
    implementation = _cargo_build_script_run_impl,
    attrs = {
        "script": attr.label(executable = True, cfg = "exec", mandatory = True),
        "crate_features": attr.string_list(),
        "version": attr.string(),
        "pkg_name": attr.string(),
        "links": attr.string(),
        "link_deps": attr.label_list(),
        "data": attr.label_list(allow_files = True),
        "compile_data": attr.label_list(allow_files = True),
        "tools": attr.label_list(cfg = "exec", allow_files = True),
        "build_script_env": attr.string_dict(),
        "_tool": attr.label(
            default = "@rules_rust//util/tool:rules_rust_tool",
            executable = True,
            cfg = "exec",
        ),
    },
    toolchains = ["@rules_rust//rust:toolchain_type"],
)

def cargo_build_script(
        name,
        crate_root = "build.rs",
        srcs = [],
        deps = [],
        proc_macro_deps = [],
        crate_features = [],
        crate_name = None,
        edition = "2021",
        version = None,
        pkg_name = None,
        links = None,
        link_deps = [],
        data = [],
        compile_data = [],
        tools = [],
        build_script_env = {},
        rustc_flags = [],
        rustc_env = {},
        rustc_env_files = [],
        tags = [],
        visibility = None,
        **kwargs):
    """Compiles a build script (for the exec platform) and runs it; dependants get its BuildInfo."""
    rust_binary(
        name = name + "_script_",
        crate_root = crate_root,
        crate_name = crate_name or "build_script_build",
        srcs = srcs,
        deps = deps,
        proc_macro_deps = proc_macro_deps,
        crate_features = crate_features,
        edition = edition,
        version = version or "0.0.0",
        compile_data = compile_data,
        rustc_flags = rustc_flags,
        rustc_env = rustc_env,
        rustc_env_files = rustc_env_files,
        tags = depset(tags + ["manual"]).to_list(),
        visibility = ["//visibility:private"],
    )
    _cargo_build_script_run(
        name = name,
        script = ":" + name + "_script_",
        crate_features = crate_features,
        version = version or "0.0.0",
        pkg_name = pkg_name or name,
        links = links or "",
        link_deps = link_deps,
        data = data,
        compile_data = compile_data,
        tools = tools,
        build_script_env = build_script_env,
        tags = tags,
        visibility = visibility,
        **kwargs
    )

def _cargo_toml_env_vars_impl(ctx):
    fail("cargo_toml_env_vars is not used by this project: generate with generate_cargo_toml_env_vars = false (tools/repin does)")

cargo_toml_env_vars = rule(
    implementation = _cargo_toml_env_vars_impl,
    attrs = {"src": attr.label(allow_single_file = True)},
)
