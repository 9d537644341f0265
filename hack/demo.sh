#!/usr/bin/env bash
# The quick start: starts the local management and workload control planes with `cso dev up`, shows what
# they serve, and stops them. Exits non-zero with a message when a step fails.
set -euo pipefail
dir="${1:?usage: demo.sh DIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

step() { printf '\n==> %s\n' "$*"; }
fail() { printf '\ndemo failed: %s\n' "$*" >&2; exit 1; }

step "building cso"
cargo build --quiet -p cso --manifest-path "$root/Cargo.toml" || fail "cargo build failed"
cso="$root/target/debug/cso"

step "starting the control planes (cso dev up --dir $dir)"
mkdir -p "$dir"
start=$SECONDS
"$cso" dev up --dir "$dir" > "$dir/dev-up.out" 2> "$dir/dev-up.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
until grep -q '^ready ' "$dir/dev-up.out" 2>/dev/null; do
  kill -0 $pid 2>/dev/null || fail "cso dev up exited: $(tail -5 "$dir/dev-up.log")"
  (( SECONDS - start < 180 )) || fail "control planes not ready after 180s: $(tail -5 "$dir/dev-up.log")"
  sleep 0.2
done
echo "ready in $((SECONDS - start))s: $(cat "$dir/dev-up.out")"
grep 'resident memory' "$dir/dev-up.log" || true

step "what the control planes serve"
"$cso" dev status --dir "$dir" || fail "cso dev status failed"

step "stopping"
kill -TERM $pid
wait $pid || fail "cso dev up did not stop cleanly"
trap - EXIT
echo "done in $((SECONDS - start))s"
