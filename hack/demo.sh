#!/usr/bin/env bash
# The quick start: `cso demo` starts a local management control plane, runs the operator with the bundled
# ferrol stack, creates a ClusterStack, waits for its ClusterClasses, prints what was created and how long
# each step took, and stops everything. Exits non-zero with a message when a step fails.
set -euo pipefail
dir="${1:?usage: demo.sh DIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

fail() { printf '\ndemo failed: %s\n' "$*" >&2; exit 1; }

printf '==> building cso\n'
cargo build --quiet -p cso --manifest-path "$root/Cargo.toml" || fail "cargo build failed"
RUST_LOG="${RUST_LOG:-warn}" "$root/target/debug/cso" demo --dir "$dir" || fail "cso demo failed (see above)"
