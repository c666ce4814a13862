"""rust_library, rust_proc_macro, rust_binary and rust_test."""

load("//rust:rust_common.bzl", "CrateInfo")
load(
    ":rustc.bzl",
    "TOOLCHAIN_TYPE",
    "collect_deps",
    "crate_name_from_label",
    "output_name",
    "package_name_for",
    "rustc_compile",
)

def _crate_root(ctx, default_names):
    if ctx.file.crate_root:
        return ctx.file.crate_root
    srcs = ctx.files.srcs
    if len(srcs) == 1:
        return srcs[0]
    for name in default_names:
        for f in srcs:
            if f.basename == name:
                return f

    # Integration tests are often named after their file with a prefix
    # (`ipu-sim-amp` for tests/amp.rs) and share helper modules (common/mod.rs).
    named = [
        f
        for f in srcs
        if ctx.label.name == f.basename[:-3] or
           ctx.label.name.endswith("-" + f.basename[:-3]) or
           ctx.label.name.endswith("_" + f.basename[:-3])
    ]
    if len(named) == 1:
        return named[0]
    not_modules = [f for f in srcs if f.basename != "mod.rs"]
    if len(not_modules) == 1:
        return not_modules[0]
    fail("%s: cannot tell the crate root among srcs; set crate_root" % ctx.label)

def _data_runfiles(ctx, crates):
    files = depset(
        ctx.files.data,
        transitive = [c.data for c in crates],
    )
    runfiles = ctx.runfiles(transitive_files = files)
    for target in ctx.attr.data:
        runfiles = runfiles.merge(target[DefaultInfo].default_runfiles)
    return files, runfiles

def _crate_spec(ctx, default_roots):
    """What rustc needs to know about the crate this rule describes."""
    deps, build_infos = collect_deps(ctx.attr.deps)
    return struct(
        crate_name = ctx.attr.crate_name or crate_name_from_label(ctx.label),
        root = _crate_root(ctx, default_roots),
        srcs = depset(ctx.files.srcs + ctx.files.compile_data),
        deps = deps,
        proc_macro_deps = [d[CrateInfo] for d in ctx.attr.proc_macro_deps],
        build_infos = build_infos,
        edition = ctx.attr.edition,
        features = ctx.attr.crate_features,
        rustc_flags = ctx.attr.rustc_flags,
        rustc_env = ctx.attr.rustc_env,
        rustc_env_files = ctx.files.rustc_env_files,
        version = ctx.attr.version,
        package_name = package_name_for(ctx),
    )

def _compile(ctx, spec, crate_type, output, is_test = False):
    return rustc_compile(
        ctx,
        crate_name = spec.crate_name,
        crate_type = crate_type,
        root = spec.root,
        srcs = spec.srcs,
        deps = spec.deps,
        proc_macro_deps = spec.proc_macro_deps,
        build_infos = spec.build_infos,
        edition = spec.edition,
        features = spec.features,
        rustc_flags = spec.rustc_flags,
        rustc_env = spec.rustc_env,
        rustc_env_files = spec.rustc_env_files,
        version = spec.version,
        package_name = spec.package_name,
        output = output,
        is_test = is_test,
    )

def _compile_crate(ctx, crate_type, default_roots):
    spec = _crate_spec(ctx, default_roots)
    if crate_type == "bin":
        output = ctx.actions.declare_file(ctx.label.name)
    else:
        output = ctx.actions.declare_file(output_name(spec.crate_name, crate_type, ctx.label))
    dep_env = None
    for info in spec.build_infos:
        dep_env = info.dep_env
    dep_files = _compile(ctx, spec, crate_type, output)
    data_files, runfiles = _data_runfiles(ctx, spec.deps)
    info = CrateInfo(
        name = spec.crate_name,
        type = crate_type,
        output = output,
        transitive_outputs = depset([output], transitive = [dep_files]),
        dep_env = dep_env,
        data = data_files,
        root = spec.root,
        srcs = spec.srcs,
        deps = spec.deps,
        proc_macro_deps = spec.proc_macro_deps,
        build_infos = spec.build_infos,
        edition = spec.edition,
        features = spec.features,
        rustc_flags = spec.rustc_flags,
        rustc_env = spec.rustc_env,
        rustc_env_files = spec.rustc_env_files,
        version = spec.version,
        package_name = spec.package_name,
    )
    return info, output, runfiles

def _rust_library_impl(ctx):
    info, output, runfiles = _compile_crate(ctx, "rlib", ["lib.rs"])
    return [info, DefaultInfo(files = depset([output]), runfiles = runfiles)]

def _rust_proc_macro_impl(ctx):
    info, output, runfiles = _compile_crate(ctx, "proc-macro", ["lib.rs"])
    return [info, DefaultInfo(files = depset([output]), runfiles = runfiles)]

def _rust_binary_impl(ctx):
    info, output, runfiles = _compile_crate(ctx, "bin", ["main.rs"])
    runfiles = ctx.runfiles(files = [output]).merge(runfiles)
    return [
        DefaultInfo(files = depset([output]), runfiles = runfiles, executable = output),
    ]

def _test_env(ctx, manifest_dir):
    env = {"CARGO_MANIFEST_DIR": manifest_dir}
    env.update(ctx.attr.env)
    return testing.TestEnvironment(env)

def _rust_test_impl(ctx):
    if ctx.attr.crate:
        # Recompile the library's own sources with --test, adding this rule's
        # deps, as rules_rust does for unit tests.
        base = ctx.attr.crate[CrateInfo]
        extra_deps, extra_build_infos = collect_deps(ctx.attr.deps)
        rustc_env = dict(base.rustc_env)
        rustc_env.update(ctx.attr.rustc_env)
        spec = struct(
            crate_name = base.name,
            root = base.root,
            srcs = depset(ctx.files.srcs + ctx.files.compile_data, transitive = [base.srcs]),
            deps = base.deps + [d for d in extra_deps if d not in base.deps],
            proc_macro_deps = base.proc_macro_deps + [d[CrateInfo] for d in ctx.attr.proc_macro_deps],
            build_infos = base.build_infos + extra_build_infos,
            edition = base.edition,
            features = base.features + ctx.attr.crate_features,
            rustc_flags = base.rustc_flags + ctx.attr.rustc_flags,
            rustc_env = rustc_env,
            rustc_env_files = base.rustc_env_files + ctx.files.rustc_env_files,
            version = base.version,
            package_name = base.package_name,
        )
        manifest_label = ctx.attr.crate.label
    else:
        spec = _crate_spec(ctx, ["main.rs", "lib.rs"])
        manifest_label = ctx.label

    output = ctx.actions.declare_file(ctx.label.name)
    _compile(ctx, spec, "bin", output, is_test = True)
    _, runfiles = _data_runfiles(ctx, spec.deps)
    if ctx.attr.crate:
        runfiles = runfiles.merge(ctx.attr.crate[DefaultInfo].default_runfiles)
    runfiles = ctx.runfiles(files = [output]).merge(runfiles)
    manifest_dir = manifest_label.package
    if manifest_label.workspace_root:
        manifest_dir = "../" + manifest_label.workspace_name + "/" + manifest_dir
    return [
        DefaultInfo(files = depset([output]), runfiles = runfiles, executable = output),
        _test_env(ctx, manifest_dir or "."),
    ]

_COMMON_ATTRS = {
    "srcs": attr.label_list(allow_files = [".rs"]),
    "crate_root": attr.label(allow_single_file = [".rs"]),
    "crate_name": attr.string(),
    "deps": attr.label_list(),
    "proc_macro_deps": attr.label_list(cfg = "exec", providers = [CrateInfo]),
    "data": attr.label_list(allow_files = True),
    "compile_data": attr.label_list(allow_files = True),
    "edition": attr.string(default = "2021"),
    "crate_features": attr.string_list(),
    "rustc_flags": attr.string_list(),
    "rustc_env": attr.string_dict(),
    "rustc_env_files": attr.label_list(allow_files = True),
    "version": attr.string(default = "0.1.0"),
    "aliases": attr.label_keyed_string_dict(),
    "_tool": attr.label(
        default = "@rules_rust//util/tool:rules_rust_tool",
        executable = True,
        cfg = "exec",
    ),
}

rust_library = rule(
    implementation = _rust_library_impl,
    attrs = _COMMON_ATTRS,
    toolchains = [TOOLCHAIN_TYPE],
    doc = "A Rust library (rlib), compiled by one rustc action.",
)

rust_proc_macro = rule(
    implementation = _rust_proc_macro_impl,
    attrs = _COMMON_ATTRS,
    toolchains = [TOOLCHAIN_TYPE],
    doc = "A Rust procedural macro crate.",
)

rust_binary = rule(
    implementation = _rust_binary_impl,
    attrs = _COMMON_ATTRS,
    executable = True,
    toolchains = [TOOLCHAIN_TYPE],
    doc = "A Rust executable.",
)

rust_test = rule(
    implementation = _rust_test_impl,
    attrs = dict(_COMMON_ATTRS, **{
        "crate": attr.label(providers = [CrateInfo]),
        "env": attr.string_dict(),
    }),
    test = True,
    toolchains = [TOOLCHAIN_TYPE],
    doc = "A Rust test: a crate's unit tests (crate = ...) or an integration test (srcs = ...).",
)
