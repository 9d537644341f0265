#!/usr/bin/env bash
# The quick start (after `make demo-tools` installed what was missing): `cso-dev demo` starts a local management
# and a workload control plane, runs the operator with the bundled ferrol stack, creates a ClusterStack and a
# Cluster, waits for the ClusterClasses and for the addons in the workload cluster, prints what was created
# where and how long each step took, and stops everything; the state directory is removed afterwards.
# Exits non-zero with a message when a step fails (the state is then kept for a look).
set -euo pipefail
dir="${1:?usage: demo.sh DIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

fail() { printf '\ndemo failed: %s\n' "$*" >&2; exit 1; }

printf '==> building cso-dev\n'
cargo build -p cso-dev --manifest-path "$root/Cargo.toml" || fail "cargo build failed"
start=$SECONDS
# kube_client logs every refused connection while the control planes start: expected, not news.
RUST_LOG="${RUST_LOG:-warn,kube_client=off}" "$root/target/debug/cso-dev" demo --dir "$dir" \
  || fail "cso-dev demo failed (see above; its state is in $dir)"
rm -rf "$dir"
printf '==> cleaned up %s (the demo itself took %ss)\n' "$dir" "$((SECONDS - start))"
