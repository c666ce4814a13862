#!/usr/bin/env bash
set -euo pipefail
index=$(echo "$*" | tr ' ' '\n' | grep 'library.json$')
exec python3 tests/toolchain/check_library.py "$index"
