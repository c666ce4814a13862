"""Stand-in for @rules_java: re-exports Bazel's native Java rules, which
@bazel_tools//tools/jdk loads while Bazel resolves toolchains (rules_java cannot
be fetched here; the project builds no Java)."""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
java_plugin = native.java_plugin
