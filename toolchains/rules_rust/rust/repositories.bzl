"""The host's pinned rustc as a Bazel toolchain repository."""

def _find_rustc(rctx, version):
    home = rctx.os.environ.get("HOME", "")
    cargo_home = rctx.os.environ.get("CARGO_HOME", home + "/.cargo")
    rustup = rctx.which("rustup")
    if not rustup and rctx.path(cargo_home + "/bin/rustup").exists:
        rustup = rctx.path(cargo_home + "/bin/rustup")
    if rustup:
        # Ask rustup for exactly the pinned toolchain; the repository's
        # working directory has no rust-toolchain.toml to do it for us.
        res = rctx.execute([rustup, "which", "rustc", "--toolchain", version])
        if res.return_code == 0:
            return res.stdout.strip()
        fail(("rustup has no Rust %s toolchain (%s).\n" +
              "Install it with `rustup toolchain install %s --profile minimal`, or run tools/setup.") %
             (version, res.stderr.strip(), version))
    rustc = rctx.which("rustc")
    if not rustc:
        fail("no rustc on PATH and no rustup under %s: install Rust %s" % (cargo_home, version))
    return str(rustc)

def _rust_host_toolchain_repository_impl(rctx):
    version = rctx.attr.version
    rustc = _find_rustc(rctx, version)
    res = rctx.execute([rustc, "--version", "--verbose"])
    if res.return_code != 0:
        fail("%s --version failed: %s" % (rustc, res.stderr))
    release = ""
    host = ""
    for line in res.stdout.splitlines():
        if line.startswith("release: "):
            release = line[len("release: "):].strip()
        if line.startswith("host: "):
            host = line[len("host: "):].strip()
    if release != version:
        fail(("rustc at %s is version %s, but this workspace pins Rust %s " +
              "(toolchains/rust/version.bzl). A different compiler would silently " +
              "change every output; install %s or change the pin deliberately.") %
             (rustc, release, version, version))
    sysroot = rctx.execute([rustc, "--print", "sysroot"]).stdout.strip()
    rctx.symlink(sysroot + "/bin", "bin")
    rctx.symlink(sysroot + "/lib", "lib")
    rctx.file("BUILD.bazel", """
load("@rules_rust//rust:toolchain.bzl", "rust_toolchain")

package(default_visibility = ["//visibility:public"])

rust_toolchain(
    name = "rust_toolchain_impl",
    rustc = "bin/rustc",
    rustc_lib = glob(["lib/*.so*"]),
    rust_std = glob(["lib/rustlib/{host}/lib/**"]),
    version = "{version}",
    target_triple = "{host}",
)

toolchain(
    name = "toolchain",
    exec_compatible_with = ["@platforms//os:linux", "@platforms//cpu:x86_64"],
    target_compatible_with = ["@platforms//os:linux", "@platforms//cpu:x86_64"],
    toolchain = ":rust_toolchain_impl",
    toolchain_type = "@rules_rust//rust:toolchain_type",
)

filegroup(name = "rustc", srcs = ["bin/rustc"])
""".format(host = host, version = version))
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)

rust_host_toolchain_repository = repository_rule(
    implementation = _rust_host_toolchain_repository_impl,
    attrs = {"version": attr.string(mandatory = True)},
    environ = ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"],
    local = True,
    doc = "Exposes the host's rustc of exactly `version` (found through rustup) as a toolchain.",
)
