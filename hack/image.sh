#!/usr/bin/env bash
# Assembles the operator image's file system exactly as the Dockerfile's final stage does (static cso for
# musl, static helm and cso-renderer, CA certificates; user 65532) without a Docker daemon, writes it as an OCI image archive
# (`docker load -i` / `podman load -i`) to target/image/cso-image.tar, and prints its size.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/image"
cd "$ROOT"

rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 || true
command -v musl-gcc >/dev/null || { echo "musl-gcc is missing: apt-get install musl-tools (make tools installs it)" >&2; exit 1; }
bash hack/tools.sh install >/dev/null
# shellcheck disable=SC1091
set -a; source "${CSO_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cso}/env"; set +a
# CSO_IMAGE_PROFILE=image-test (`make image-test`): the same file system, built faster, for the tests.
PROFILE="${CSO_IMAGE_PROFILE:-image}"
cargo build --locked --profile "$PROFILE" -p cso --target x86_64-unknown-linux-musl

rm -rf "$OUT" && mkdir -p "$OUT/rootfs/usr/local/bin" "$OUT/rootfs/etc/ssl/certs"
cp "target/x86_64-unknown-linux-musl/$PROFILE/cso" "$OUT/rootfs/usr/local/bin/cso"
cp "$CSO_HELM" "$OUT/rootfs/usr/local/bin/helm"
# The long-lived renderer on Helm's engine (hack/renderer), beside helm: `cso_render::Engine` runs it.
cp "$CSO_RENDERER" "$OUT/rootfs/usr/local/bin/cso-renderer"
cp /etc/ssl/certs/ca-certificates.crt "$OUT/rootfs/etc/ssl/certs/ca-certificates.crt"

# Fully qualified (what `docker load` calls `cso:latest`): containerd's CRI plugin finds no image imported under a
# short name. CSO_IMAGE_NAME names it otherwise.
python3 hack/oci-archive.py "$OUT/rootfs" "$OUT/cso-image.tar" --name "${CSO_IMAGE_NAME:-docker.io/library/cso:latest}" \
  --user 65532:65532 --entrypoint '["/usr/local/bin/cso"]' --cmd '["run"]' \
  --env PATH=/usr/local/bin --env HOME=/tmp --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --env MIMALLOC_PURGE_DELAY=0
for name in cso helm cso-renderer; do
  echo "  usr/local/bin/$name: $(du -m "$OUT/rootfs/usr/local/bin/$name" | cut -f1) MiB"
done
