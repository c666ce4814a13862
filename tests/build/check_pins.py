#!/usr/bin/env python3
"""Fails when Cargo.lock and the generated third_party/crates disagree.

Every crate archive that Bazel fetches (third_party/crates/defs.bzl) must be the
exact package that Cargo.lock pins (same name, version and sha256), every BUILD
file must belong to a fetched crate, and every registry dependency of a
workspace member must have an alias in third_party/crates/BUILD.bazel. The fix
for any failure is `tools/repin`.
"""
import re
import sys
import tomllib
from pathlib import Path


def main(lock_path: Path, crates_dir: Path) -> int:
    lock = tomllib.loads(lock_path.read_text())
    packages = lock.get("package", [])
    pinned = {
        (p["name"], p["version"]): p.get("checksum")
        for p in packages
        if p.get("source", "").startswith(("registry+", "sparse+"))
    }
    errors = []

    # Bazel repository names cannot hold '+', so cargo-bazel writes it as '-'.
    by_repo_name = {f"{n}-{v}".replace("+", "-"): (n, v) for (n, v) in pinned}
    defs = (crates_dir / "defs.bzl").read_text()
    fetched = {}
    for m in re.finditer(r'name = "crates__([^"]+)",\s*\n\s*sha256 = "([0-9a-f]{64})"', defs):
        repo_name, sha = m.groups()
        fetched[repo_name] = sha
        if repo_name not in by_repo_name:
            errors.append(f"defs.bzl fetches {repo_name}, which Cargo.lock does not pin")
        elif pinned[by_repo_name[repo_name]] != sha:
            errors.append(f"defs.bzl fetches {repo_name} with sha256 {sha}, "
                          f"Cargo.lock says {pinned[by_repo_name[repo_name]]}")
    if not fetched:
        errors.append(f"no crate repositories found in {crates_dir / 'defs.bzl'}")

    fetched_versions = {by_repo_name[r] for r in fetched if r in by_repo_name}
    for build in sorted(crates_dir.glob("BUILD.*.bazel")):
        name_version = build.name[len("BUILD."):-len(".bazel")]
        if not any(f"{n}-{v}" == name_version for (n, v) in fetched_versions):
            errors.append(f"{build.name} has no crate repository in defs.bzl")

    hub = (crates_dir / "BUILD.bazel").read_text()
    aliases = set(re.findall(r'alias\(\s*\n\s*name = "([^"]+)"', hub))
    members = [p for p in packages if "source" not in p]
    for member in members:
        for dep in member.get("dependencies", []):
            dep_name = dep.split(" ")[0]
            if any(p["name"] == dep_name and "source" not in p for p in packages):
                continue  # another workspace member
            if dep_name not in aliases:
                errors.append(f"workspace member {member['name']} depends on {dep_name}, "
                              f"but third_party/crates/BUILD.bazel has no alias for it")

    for e in errors:
        print(f"pin mismatch: {e}", file=sys.stderr)
    if errors:
        print("run tools/repin and commit Cargo.lock and third_party/crates", file=sys.stderr)
        return 1
    print(f"pins agree: {len(fetched)} crates fetched by sha256, {len(members)} workspace members")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
