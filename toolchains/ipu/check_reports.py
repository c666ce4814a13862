"""Checks that compile reports name no kernel their library lacks.

Usage: check_reports.py REPORT.json...

Each report is an `ipu compile --report` file. A report whose
`specialisations_that_would_help` is not empty was compiled against a
library without a kernel its plans would use (the compiler then plans
without it, so the package is correct but slower); the check prints each
such package, kernel, value and reason, and fails.
"""

import json
import sys


def main(paths):
    if not paths:
        print("check_reports.py: no reports given", file=sys.stderr)
        return 2
    missing = 0
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                report = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{path}: cannot read the report: {e}", file=sys.stderr)
            return 2
        helps = report.get("specialisations_that_would_help")
        if helps is None:
            print(f"{path}: no `specialisations_that_would_help` field", file=sys.stderr)
            return 2
        for h in helps:
            missing += 1
            print(
                f"{path}: the kernel library lacks `{h.get('kernel')}` "
                f"(value `{h.get('value')}`): {h.get('why')}"
            )
    print(f"{len(paths)} compile reports checked, {missing} missing kernels")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
