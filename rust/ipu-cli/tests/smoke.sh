#!/usr/bin/env bash
# The ipu binary starts, reports its version, and prints the machine model
# with the constants of ipu-arch.
set -euo pipefail
ipu=$1
version=$("$ipu" --version)
[[ "$version" == "ipu 0.1.0" ]] || { echo "unexpected --version: $version"; exit 1; }
table=$("$ipu" machine)
grep -q "^tiles per chip  *1472$" <<<"$table" || { echo "machine table lacks 1472 tiles: $table"; exit 1; }
json=$("$ipu" machine --json)
grep -q '"chip f16 FLOP per cycle": "188416"' <<<"$json" || { echo "machine --json lacks the chip peak: $json"; exit 1; }
if "$ipu" no-such-command 2>/dev/null; then echo "an unknown subcommand must fail"; exit 1; fi
echo "ipu smoke: ok"
