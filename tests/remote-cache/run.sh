#!/usr/bin/env bash
# End-to-end test of the team remote cache (tools/remote-cache), run by CI.
#
#   tests/remote-cache/run.sh [TARGET...]     (default: //rust/ipu-cli:ipu)
#
# 1. Starts the nginx cache server in a temporary folder on a free port of
#    127.0.0.1 and checks its health.
# 2. Clones the committed HEAD into folder A and builds TARGET as the writer
#    (--config=remote-cache-writer, its password in A's .bazelrc.user exactly
#    as `tools/remote-cache/server writer-config` prints it), with its own
#    output base and no disk cache. Bazel must print no remote-cache warning,
#    and the server's log must show every upload stored.
# 3. Clones again into folder B at another path and builds as an anonymous
#    reader (--config=remote-cache), again with its own output base and an
#    empty (disabled) disk cache. Every cacheable action (every process Bazel
#    does not count as "internal") must be a remote cache hit, B must upload
#    nothing, and every output file of A and B must be byte-identical.
# 4. Stops the server and both Bazel servers, and removes the folder (kept
#    with KEEP_WORK=1).
#
# Prints "remote cache test: PASSED, H of C cacheable actions were remote cache
# hits" and exits 0, or prints what failed and exits 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
targets=("$@")
((${#targets[@]})) || targets=(//rust/ipu-cli:ipu)
say() { printf 'remote cache test: %s\n' "$*"; }
fail() { printf 'remote cache test: FAILED: %s\n' "$*" >&2; exit 1; }

for tool in nginx bazel git python3 openssl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (run tools/setup)"
done

work=$(mktemp -d /tmp/ipu-remote-cache.XXXXXX)
server="$work/server"
cleanup() {
  local status=$?
  "$root/tools/remote-cache/server" stop "$server" >/dev/null 2>&1 || true
  for side in a b; do
    if [[ -f "$work/$side.dir" ]]; then
      (cd "$(<"$work/$side.dir")" && bazel --nohome_rc --output_user_root="$work/$side/root" shutdown >/dev/null 2>&1) || true
    fi
  done
  if [[ "${KEEP_WORK:-0}" == 1 ]]; then
    echo "remote cache test: work folder kept: $work" >&2
  else
    # Bazel makes its output trees read-only; make them writable to remove them.
    chmod -R u+w "$work" 2>/dev/null || true
    rm -rf "$work"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free port: the kernel picks one; if another process takes it before nginx
# binds it, the server script says so and we try again with a new one.
port=""
for attempt in 1 2 3; do
  candidate=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  if "$root/tools/remote-cache/server" start "$server" --port "$candidate" >"$work/server-start.log" 2>&1; then
    port=$candidate
    break
  fi
  grep -q "already in use" "$work/server-start.log" || { cat "$work/server-start.log" >&2; fail "the cache server did not start"; }
done
[[ -n "$port" ]] || fail "no free port on 127.0.0.1 after 3 attempts"
url="http://127.0.0.1:$port"
say "server at $url (folder $server)"
"$root/tools/remote-cache/health" --dir "$server" >"$work/health-0.log" 2>&1 \
  || { cat "$work/health-0.log" >&2; fail "the fresh server is not healthy"; }

# Builds one side. Output to $work/<side>.log; the Bazel summary line is
# checked by the caller.
build_side() {
  local side=$1 dir=$2 config=$3
  local start=$SECONDS
  echo "$dir" >"$work/$side.dir"
  mkdir -p "$(dirname "$dir")"
  git clone -q "$root" "$dir"
  if [[ $config == remote-cache-writer ]]; then
    # The writer's password goes where the docs say: .bazelrc.user (ignored by git).
    "$root/tools/remote-cache/server" writer-config "$server" | grep '^build:remote-cache-writer' >"$dir/.bazelrc.user"
  fi
  # --nohome_rc: the test must not depend on the user's ~/.bazelrc (which may
  # point at a team cache). The address is given on the command line because
  # the port is chosen at run time.
  (cd "$dir" && bazel --nohome_rc --output_user_root="$work/$side/root" build \
      --config="$config" --remote_cache="$url" --disk_cache= \
      "${targets[@]}" >"$work/$side.log" 2>&1) \
    || { tail -40 "$work/$side.log" >&2; fail "build in clone $side ($config) failed; log above"; }
  say "clone $side ($config) built in $((SECONDS - start)) s"
  if grep -n "WARNING: .*Remote Cache" -A2 "$work/$side.log" >&2; then
    fail "Bazel warned about the remote cache in clone $side (lines above): uploads or downloads failed"
  fi
}

# Prints "total internal hits" from the last "N processes: ..." summary line.
process_counts() {
  python3 - "$1" <<'EOF'
import re, sys
lines = [l for l in open(sys.argv[1], errors="replace") if re.match(r"INFO: \d+ process(es)?[:.]", l)]
if not lines:
    sys.exit(f"{sys.argv[1]}: no 'INFO: N processes' summary line")
line = lines[-1].strip()
total = int(re.match(r"INFO: (\d+)", line).group(1))
kinds = {}
for count, kind in re.findall(r"(\d+) ([a-z][a-z -]*?)(?=[,.]|$)", line.split(":", 1)[1]):
    kinds[kind.strip()] = kinds.get(kind.strip(), 0) + int(count)
print(total, kinds.get("internal", 0), kinds.get("remote cache hit", 0), "|", line)
EOF
}

# Sorted "sha256 path" of every regular file under bazel-out/*/bin. Runfiles
# trees are symlinks and their manifests name the output base, which differs
# on purpose, so they are left out.
output_sums() {
  local dir=$1 side=$2
  local out
  out=$(cd "$dir" && bazel --nohome_rc --output_user_root="$work/$side/root" info output_path 2>/dev/null)
  (cd "$out" && find . -path './*/bin/*' -type f ! -name '*.runfiles_manifest' ! -path '*.runfiles/*' -print0 \
    | sort -z | xargs -0 -r sha256sum)
}

# Side A: the writer, from an empty cache.
dir_a="$work/a/src"
build_side a "$dir_a" remote-cache-writer
read -r total_a internal_a hits_a summary_a < <(process_counts "$work/a.log")
say "clone a: ${summary_a#| } ($((total_a - internal_a)) cacheable, $hits_a hits)"
"$root/tools/remote-cache/health" --dir "$server" >"$work/health-a.log" 2>&1 \
  || { cat "$work/health-a.log" >&2; fail "server unhealthy after the writer's build: uploads failed"; }
stored=$(sed -n 's/.*uploads since the previous check: \([0-9]*\) stored.*/\1/p' "$work/health-a.log")
((stored > 0)) || fail "the writer's build uploaded nothing (health log: $work/health-a.log)"
say "writer uploads stored: $stored"
log_lines=$(wc -l <"$server/logs/access.log")

# Side B: an anonymous reader at another path (a longer one, so any absolute
# path leaking into an action key or an output would show).
dir_b="$work/b/another-checkout-folder/src"
build_side b "$dir_b" remote-cache
read -r total_b internal_b hits_b summary_b < <(process_counts "$work/b.log")
say "clone b: ${summary_b#| }"
cacheable=$((total_b - internal_b))
((cacheable > 0)) || fail "clone b ran no cacheable action: nothing was tested"
puts_b=$(tail -n +"$((log_lines + 1))" "$server/logs/access.log" | awk '$4 == "PUT"' | wc -l)
((puts_b == 0)) || fail "the anonymous reader in clone b tried $puts_b uploads"

output_sums "$dir_a" a >"$work/a.sums"
output_sums "$dir_b" b >"$work/b.sums"
files=$(wc -l <"$work/a.sums")
((files > 0)) || fail "no output files found under clone a's bazel-out"
if ! diff "$work/a.sums" "$work/b.sums" >"$work/sums.diff"; then
  head -40 "$work/sums.diff" >&2
  fail "outputs differ between clone a and clone b (sha256 lines above; < is a, > is b)"
fi
say "all $files output files byte-identical between the two clones"
for t in "${targets[@]}"; do
  (cd "$dir_b" && bazel --nohome_rc --output_user_root="$work/b/root" cquery --output=starlark \
      --starlark:expr='"\n".join([f.path for f in target.files.to_list()])' "$t" 2>/dev/null) \
    | while read -r f; do say "  $(cd "$dir_b" && sha256sum "$f")"; done
done

if ((hits_b != cacheable)); then
  fail "only $hits_b of $cacheable cacheable actions in clone b were remote cache hits"
fi
say "PASSED, $hits_b of $cacheable cacheable actions were remote cache hits ($internal_b internal, $total_b processes)"
