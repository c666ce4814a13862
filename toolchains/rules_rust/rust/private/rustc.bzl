"""The rustc action shared by every Rust rule."""

load("//rust:rust_common.bzl", "BuildInfo", "CrateInfo")

TOOLCHAIN_TYPE = "@rules_rust//rust:toolchain_type"

def crate_name_from_label(label):
    return label.name.replace("-", "_").replace(".", "_")

def _package_dir(label):
    """The crate's directory relative to the execution root."""
    parts = [p for p in [label.workspace_root, label.package] if p]
    return "/".join(parts) if parts else "."

def _opt_flags(ctx):
    mode = ctx.var["COMPILATION_MODE"]
    if mode == "opt":
        return ["-Copt-level=3", "-Cdebuginfo=0"]
    if mode == "dbg":
        return ["-Copt-level=0", "-Cdebuginfo=2"]
    return ["-Copt-level=1", "-Cdebuginfo=0"]

def _short_hash(text):
    # Starlark's hash() is Java's String.hashCode: stable across machines and
    # Bazel versions, which keeps symbol names and outputs reproducible.
    h = hash(text)
    if h < 0:
        h = -h
    return str(h)

def _pkg_version_env(version):
    env = {"CARGO_PKG_VERSION": version}
    core = version.split("+")[0]
    pre = ""
    if "-" in core:
        core, pre = core.split("-", 1)
    parts = (core.split(".") + ["0", "0", "0"])[:3]
    env["CARGO_PKG_VERSION_MAJOR"] = parts[0]
    env["CARGO_PKG_VERSION_MINOR"] = parts[1]
    env["CARGO_PKG_VERSION_PATCH"] = parts[2]
    env["CARGO_PKG_VERSION_PRE"] = pre
    return env

def package_name_for(ctx):
    """CARGO_PKG_NAME: cargo-bazel records it in a `crate-name=` tag."""
    for tag in getattr(ctx.attr, "tags", []):
        if tag.startswith("crate-name="):
            return tag[len("crate-name="):]
    return ctx.label.name

def collect_deps(dep_targets):
    """Splits `deps` into crates and build-script results."""
    crates = []
    build_infos = []
    for dep in dep_targets:
        if CrateInfo in dep:
            crates.append(dep[CrateInfo])
        elif BuildInfo in dep:
            build_infos.append(dep[BuildInfo])
        else:
            fail("%s is neither a Rust crate nor a cargo_build_script" % dep.label)
    return crates, build_infos

def rustc_compile(
        ctx,
        crate_name,
        crate_type,
        root,
        srcs,
        deps,
        proc_macro_deps,
        build_infos,
        edition,
        features,
        rustc_flags,
        rustc_env,
        rustc_env_files,
        version,
        package_name,
        output,
        is_test = False,
        label = None):
    """Registers one rustc action and returns the files it read."""
    label = label or ctx.label
    toolchain = ctx.toolchains[TOOLCHAIN_TYPE].rust
    pkg_dir = _package_dir(label)
    is_external = bool(label.workspace_root)

    args = ctx.actions.args()
    args.add("--subst-pwd")
    for info in build_infos:
        args.add("--arg-file", info.flags)
        args.add("--env-file", info.env)
    for f in rustc_env_files:
        args.add("--env-file", f)

    env = {
        "CARGO_CRATE_NAME": crate_name,
        "CARGO_PKG_NAME": package_name,
        "CARGO_PKG_AUTHORS": "",
        "CARGO_PKG_DESCRIPTION": "",
        "CARGO_PKG_HOMEPAGE": "",
        "CARGO_PKG_REPOSITORY": "",
        "CARGO_PKG_LICENSE": "",
        "CARGO_PKG_LICENSE_FILE": "",
        "CARGO_PKG_RUST_VERSION": "",
        "CARGO_PKG_README": "",
        "CARGO": "cargo",
    }
    env.update(_pkg_version_env(version or "0.0.0"))

    # Third-party crates may read CARGO_MANIFEST_DIR at compile time through
    # include_str!, which resolves relative paths against the source file, so
    # they get an absolute path (remapped away by --remap-path-prefix). Our own
    # crates read it at run time from the test's working directory, where the
    # relative package path is the right answer under Bazel.
    if is_external:
        env["CARGO_MANIFEST_DIR"] = "${pwd}/" + pkg_dir
    else:
        env["CARGO_MANIFEST_DIR"] = pkg_dir
    env.update(rustc_env)
    for key in sorted(env.keys()):
        args.add("--env", "%s=%s" % (key, env[key]))

    args.add("--")
    args.add(toolchain.rustc)
    args.add(root)
    args.add("--crate-name=" + crate_name)
    if is_test:
        args.add("--test")
    else:
        args.add("--crate-type=" + crate_type)
    args.add("--edition=" + edition)
    args.add("--sysroot=" + toolchain.sysroot)
    args.add("--error-format=human")
    args.add("--remap-path-prefix=${pwd}=.")
    args.add_all(_opt_flags(ctx))
    metadata = _short_hash(str(label) + ("#test" if is_test else ""))
    args.add("-Cmetadata=" + metadata)
    args.add("-o", output)
    if crate_type == "proc-macro":
        args.add("--extern=proc_macro")
    for feature in features:
        args.add('--cfg=feature="%s"' % feature)

    transitive = []
    for dep in deps + proc_macro_deps:
        args.add("--extern=%s=%s" % (dep.name, dep.output.path))
        transitive.append(dep.transitive_outputs)
    dep_files = depset(transitive = transitive)
    args.add_all(
        dep_files,
        map_each = _dependency_dir,
        uniquify = True,
        format_each = "-Ldependency=%s",
    )
    if is_external:
        args.add("--cap-lints=allow")
    args.add_all(rustc_flags)

    inputs = depset(
        direct = [root] + rustc_env_files +
                 [f for info in build_infos for f in [info.flags, info.env, info.out_dir]],
        transitive = [srcs, dep_files, toolchain.all_files],
    )
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = inputs,
        outputs = [output],
        mnemonic = "Rustc",
        progress_message = "Compiling Rust %s %s (%s)" % (crate_type if not is_test else "test", crate_name, label),
        use_default_shell_env = True,
    )
    return dep_files

def _dependency_dir(f):
    return f.dirname

def output_name(crate_name, crate_type, label, is_test = False):
    suffix = _short_hash(str(label) + ("#test" if is_test else ""))
    if crate_type == "rlib":
        return "lib%s-%s.rlib" % (crate_name, suffix)
    if crate_type == "proc-macro":
        return "lib%s-%s.so" % (crate_name, suffix)
    return None
