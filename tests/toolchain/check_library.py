#!/usr/bin/env python3
"""Checks what ipu_kernel and ipu_kernel_library produced for //device:kernels:
every indexed kernel has its object and metadata, the metadata names the kernel
and target, and each specialisation's -D parameters reached the assembler."""
import json
import sys
from pathlib import Path


def runfile(path: str) -> Path:
    # Index paths are relative to the execution root (bazel-out/<cfg>/bin/...);
    # in the test's runfiles the same files sit at their package paths.
    return Path(path.split("/bin/", 1)[1]) if "/bin/" in path else Path(path)


def main(index_path: str) -> int:
    index = json.loads(Path(index_path).read_text())
    kernels = {k["name"]: k for k in index["kernels"]}
    assert kernels, "the library lists no kernels"
    for name, k in sorted(kernels.items()):
        assert k["arch"] == "ipu21", (name, k["arch"])
        obj = runfile(k["object"])
        assert obj.exists() and obj.stat().st_size > 0, f"{name}: no object at {obj}"
        meta = json.loads(runfile(k["metadata"]).read_text())
        assert meta["kernel"] == name, (name, meta["kernel"])
        assert meta["target"] == "ipu21", (name, meta["target"])
        for key, value in k["params"].items():
            got = meta["parameters"].get(key)
            assert got == int(value), f"{name}: parameter {key} is {got}, the BUILD file says {value}"
    # Two specialisations of one source must differ in code or metadata.
    a = runfile(kernels["gemm_f16_acc16"]["object"]).read_bytes()
    b = runfile(kernels["gemm_f16_acc32"]["object"]).read_bytes()
    assert a != b, "gemm_f16 ACC=16 and ACC=32 assembled to the same object"
    print(f"kernel library ok: {len(kernels)} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
