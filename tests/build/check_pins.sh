#!/usr/bin/env bash
# Runs check_pins.py with the host's Python 3 (3.11 or later, for tomllib).
set -euo pipefail
here=$(dirname "$0")
exec python3 "$here/check_pins.py" "$1" "$(dirname "$2")"
