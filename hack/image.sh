#!/usr/bin/env bash
# Assembles the operator image's file system exactly as the Dockerfile's final stage does (static cso for
# musl, static helm and cso-renderer, CA certificates; user 65532) without a Docker daemon, writes it as an OCI image archive
# (`docker load -i` / `podman load -i`) to target/image/cso-image.tar, and prints its size.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/image"
cd "$ROOT"

rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 || true
command -v musl-gcc >/dev/null || { echo "musl-gcc is missing: apt-get install musl-tools" >&2; exit 1; }
bash hack/tools.sh install >/dev/null
# shellcheck disable=SC1091
set -a; source "${CSO_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cso}/env"; set +a
cargo build --locked --profile image -p cso --target x86_64-unknown-linux-musl

rm -rf "$OUT" && mkdir -p "$OUT/rootfs/usr/local/bin" "$OUT/rootfs/etc/ssl/certs"
cp target/x86_64-unknown-linux-musl/image/cso "$OUT/rootfs/usr/local/bin/cso"
cp "$CSO_HELM" "$OUT/rootfs/usr/local/bin/helm"
# The long-lived renderer on Helm's engine (hack/renderer), beside helm: `cso_render::Engine` runs it.
cp "$CSO_RENDERER" "$OUT/rootfs/usr/local/bin/cso-renderer"
cp /etc/ssl/certs/ca-certificates.crt "$OUT/rootfs/etc/ssl/certs/ca-certificates.crt"

python3 - "$OUT" <<'PY'
import gzip, hashlib, io, json, os, sys, tarfile
out = sys.argv[1]
rootfs = os.path.join(out, "rootfs")
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
    for base, dirs, files in sorted(os.walk(rootfs)):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            path = os.path.join(base, name)
            info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
            info.uid = info.gid = 0; info.uname = info.gname = ""; info.mtime = 0
            if info.isfile():
                with open(path, "rb") as f: tar.addfile(info, f)
            else:
                tar.addfile(info)
raw = layer.getvalue()
packed = gzip.compress(raw, compresslevel=9, mtime=0)
blobs = {}
def blob(data, media):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media, "digest": digest, "size": len(data)}
config = json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"User": "65532:65532", "Entrypoint": ["/usr/local/bin/cso"], "Cmd": ["run"],
               "Env": ["PATH=/usr/local/bin", "HOME=/tmp", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
}).encode()
manifest = json.dumps({
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": blob(config, "application/vnd.oci.image.config.v1+json"),
    "layers": [blob(packed, "application/vnd.oci.image.layer.v1.tar+gzip")],
}).encode()
entry = blob(manifest, "application/vnd.oci.image.manifest.v1+json")
entry["annotations"] = {"org.opencontainers.image.ref.name": "cso:latest", "io.containerd.image.name": "cso:latest"}
index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [entry]}).encode()
with tarfile.open(os.path.join(out, "cso-image.tar"), "w") as tar:
    def add(name, data):
        info = tarfile.TarInfo(name); info.size = len(data); tar.addfile(info, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", index)
    for digest, data in blobs.items():
        add("blobs/sha256/" + digest.split(":")[1], data)
mib = lambda n: f"{n / 1048576:.1f} MiB"
print(f"image: {os.path.join(out, 'cso-image.tar')}")
print(f"  compressed (pulled) size: {mib(len(packed) + len(config) + len(manifest))}")
print(f"  unpacked size: {mib(len(raw))}")
for name in ("usr/local/bin/cso", "usr/local/bin/helm", "usr/local/bin/cso-renderer"):
    print(f"  {name}: {mib(os.path.getsize(os.path.join(rootfs, name)))}")
PY
