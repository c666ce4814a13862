#!/usr/bin/env bash
# Runs check_reports.py (its path is the first argument; ipu_reports_test,
# package.bzl) over the reports that follow, with the host's Python 3.
set -euo pipefail
exec python3 "$@"
