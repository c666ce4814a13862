#!/usr/bin/env python3
"""Checks what ipu_kernel and ipu_kernel_library produced: one object and one
metadata file per declared specialisation, the parameters applied, and an index
that lists exactly those kernels."""
import json
import sys
from pathlib import Path


def main(index_path: str) -> int:
    index = json.loads(Path(index_path).read_text())
    kernels = {k["name"]: k for k in index["kernels"]}
    assert sorted(kernels) == ["sample", "sample_k64"], f"unexpected kernels {sorted(kernels)}"
    for name, k in kernels.items():
        assert k["arch"] == "ipu21", k
        obj = Path(k["object"].split("/bin/", 1)[1])
        meta = json.loads(Path(k["metadata"].split("/bin/", 1)[1]).read_text())
        assert obj.exists() and obj.stat().st_size > 0, f"{name}: no object at {obj}"
        assert meta["kernel"] == name, meta["kernel"]
        assert meta["target"] == "ipu21", meta["target"]
    assert kernels["sample_k64"]["params"] == {"K": "64"}
    assert json.loads(Path("tests/toolchain/sample_k64/kernel.json").read_text())["parameters"]["K"] == 64
    print(f"kernel library ok: {len(kernels)} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
