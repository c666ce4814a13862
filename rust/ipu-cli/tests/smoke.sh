#!/usr/bin/env bash
# The ipu binaries together: the CLI starts, reports its version and the
# machine model, and a program goes through ipu-as, ipu-ld, `ipu object
# inspect` and `ipu sim` with the cycle count the issue model predicts.
set -euo pipefail
ipu=$1 as=$2 ld=$3 src=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

version=$("$ipu" --version)
[[ "$version" == "ipu 0.1.0" ]] || { echo "unexpected --version: $version"; exit 1; }
table=$("$ipu" machine)
grep -q "^tiles per chip  *1472$" <<<"$table" || { echo "machine table lacks 1472 tiles: $table"; exit 1; }
json=$("$ipu" machine --json)
grep -q '"chip f16 FLOP per cycle": "188416"' <<<"$json" || { echo "machine --json lacks the chip peak: $json"; exit 1; }
if "$ipu" no-such-command 2>/dev/null; then echo "an unknown subcommand must fail"; exit 1; fi

"$as" "$src" -o "$work/countdown.o"
"$ld" "$work/countdown.o" -o "$work/countdown.img" --entry main
listing=$("$ipu" object inspect "$work/countdown.img")
grep -q "brnzdec \$m1" <<<"$listing" || { echo "inspect lacks the loop: $listing"; exit 1; }
out=$("$ipu" sim "$work/countdown.img" --tiles 3)
# 1 setzi + 101 brnzdec + 1 exit = 103 supervisor bundles, one per 6 cycles.
grep -q "bundles 309$" <<<"$out" || { echo "expected 3 x 103 bundles: $out"; exit 1; }
cycles=$(sed -n 's/^total cycles //p' <<<"$out")
(( cycles >= 102 * 6 )) || { echo "the supervisor issued faster than once per 6 cycles: $cycles"; exit 1; }
if "$ipu" sim "$src" 2>"$work/err"; then echo "a source file is not an image"; exit 1; fi
grep -q "countdown.S" "$work/err" || { echo "the error must name the file: $(cat "$work/err")"; exit 1; }
# Compile options are checked before anything is read or written.
if "$ipu" compile "$src" -o "$work/p.ipupkg" --option host_inputs=sideways 2>"$work/err"; then echo "a bad option value must fail"; exit 1; fi
grep -q "host_inputs=sideways: expected once or replicated" "$work/err" || { echo "the error must name the option and its values: $(cat "$work/err")"; exit 1; }
if "$ipu" compile "$src" -o "$work/p.ipupkg" --option no_such=1 2>"$work/err"; then echo "an unknown option must fail"; exit 1; fi
grep -q "known options are .*host_inputs" "$work/err" || { echo "the error must list the known options: $(cat "$work/err")"; exit 1; }
[[ ! -e "$work/p.ipupkg" ]] || { echo "a refused compile wrote a package"; exit 1; }
# The HTML view of a profile names a profile it cannot read, and never
# writes over the profile itself.
if "$ipu" profile html "$work/none.ipuprofile" 2>"$work/err"; then echo "a missing profile must fail"; exit 1; fi
grep -q "none.ipuprofile" "$work/err" || { echo "the error must name the profile: $(cat "$work/err")"; exit 1; }
echo '{}' >"$work/p.json"
if "$ipu" profile html "$work/p.json" -o "$work/p.json" 2>"$work/err"; then echo "html over its own profile must fail"; exit 1; fi
grep -q "would replace the profile" "$work/err" || { echo "the error must say why: $(cat "$work/err")"; exit 1; }
[[ "$(cat "$work/p.json")" == "{}" ]] || { echo "the profile was overwritten"; exit 1; }
if "$ipu" profile html "$work/p.json" -o "$work/p.html" 2>"$work/err"; then echo "a file that is no profile must fail"; exit 1; fi
grep -q "p.json: not an ipuprofile" "$work/err" || { echo "the error must name the file: $(cat "$work/err")"; exit 1; }
[[ ! -e "$work/p.html" ]] || { echo "a refused profile wrote a page"; exit 1; }
echo "ipu smoke: ok ($cycles cycles)"
