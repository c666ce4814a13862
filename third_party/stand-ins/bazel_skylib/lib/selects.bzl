"""Stand-in for bazel_skylib's selects (with_or, with_or_dict), which cargo-bazel's defs.bzl loads."""

load("@rules_rust//crate_universe/private:selects.bzl", _selects = "selects")

selects = _selects
