"""Bazel's built-in CcInfo under another name, so defs.bzl can re-export it as CcInfo."""

cc_info = CcInfo
