#!/usr/bin/env bash
# Runs the eviction tests with the system Python 3 (standard library only).
set -euo pipefail
exec python3 "$1" "$2"
