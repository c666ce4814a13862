"""Stand-in for @rules_cc: re-exports Bazel's native C++ rules (rules_cc cannot be fetched here)."""


load(":builtins.bzl", CcInfo = "cc_info")

# CcInfo is re-exported through the load above: a top-level assignment may not
# shadow a built-in name.
cc_library = native.cc_library
cc_binary = native.cc_binary
cc_test = native.cc_test
cc_import = native.cc_import
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
objc_import = native.objc_import

