#!/usr/bin/env bash
# Makes crates/release/tests/fixtures/cosign/ anew: real cosign v3 signatures (hack/tools.sh's CSO_COSIGN) of a
# release manifest in a throwaway docker-registry on loopback, in both layouts and with several kinds of key, saved
# byte for byte as the registry stores them, for the verifier's unit tests (crates/release/src/source/verify.rs).
# The fixtures' README.md says what each file is. Every run makes new keys and signatures (ECDSA is randomised),
# so the files all change together; nothing else reads them.
#
#   bash hack/cosign-fixtures.sh [OUT_DIR]     (default: crates/release/tests/fixtures/cosign)
#
# Needs cosign (`make tools`), docker-registry, openssl (P-384, RSA and Ed25519 keys, imported into cosign), curl
# and python3. Offline: no transparency log, no TUF root; the registry listens on 127.0.0.1 only.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/crates/release/tests/fixtures/cosign}"
COSIGN="${CSO_COSIGN:-$(bash "$ROOT/hack/tools.sh" --env 2>/dev/null | sed -n 's/^CSO_COSIGN=//p')}"
REGISTRY_BIN="${CSO_REGISTRY:-$(command -v docker-registry || true)}"
[[ -x "$COSIGN" ]] || { echo "cosign not found ($COSIGN): run make tools" >&2; exit 1; }
[[ -x "$REGISTRY_BIN" ]] || { echo "docker-registry not found: run make tools" >&2; exit 1; }
command -v openssl >/dev/null || { echo "openssl not found" >&2; exit 1; }

WORK="$(mktemp -d)"
REGISTRY_PID=""
cleanup() {
  if [[ -n "$REGISTRY_PID" ]]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
say() { printf '[cosign-fixtures] %s\n' "$*" >&2; }

# cosign offline and isolated: its own HOME, TUF root and Docker config; keys with an empty password.
cosign() {
  (cd "$WORK" && HOME="$WORK/home" TUF_ROOT="$WORK/home/tuf" SIGSTORE_NO_CACHE=true DOCKER_CONFIG="$WORK/home/docker" \
    COSIGN_PASSWORD= "$COSIGN" "$@")
}

# --- a registry on a free loopback port ---
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
HOST="127.0.0.1:$PORT"
REPO="kaas/stacks"
API="http://$HOST/v2/$REPO"
cat > "$WORK/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $WORK/registry
http:
  addr: $HOST
EOF
"$REGISTRY_BIN" serve "$WORK/registry.yml" > "$WORK/registry.log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 100); do curl -fs "http://$HOST/v2/" >/dev/null && break; sleep 0.1; done
curl -fs "http://$HOST/v2/" >/dev/null || { cat "$WORK/registry.log" >&2; exit 1; }
say "registry at $HOST ($("$REGISTRY_BIN" --version 2>/dev/null | head -1)); $(cosign version 2>/dev/null | grep GitVersion)"

ACCEPT="application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json"
# push_blob FILE: uploads FILE (POST, then a monolithic PUT); prints its digest.
push_blob() {
  local digest location
  digest="sha256:$(sha256sum "$1" | cut -c1-64)"
  location="$(curl -fs -D- -o /dev/null -X POST "$API/blobs/uploads/" | tr -d '\r' | awk 'tolower($1) == "location:" { print $2 }')"
  [[ "$location" == http* ]] || location="http://$HOST$location"
  curl -fs -o /dev/null -X PUT -H 'Content-Type: application/octet-stream' --data-binary "@$1" "$location&digest=$digest"
  echo "$digest"
}
get_manifest() { curl -fs -H "Accept: $ACCEPT" "$API/manifests/$1"; }
get_blob() { curl -fs "$API/blobs/$1"; }
json() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# --- the release: one file, pushed as `oras push --artifact-type application/vnd.clusterstack.release` does ---
printf 'apiVersion: metadata.clusterstack.x-k8s.io/v1alpha1\nversions:\n  clusterStack: v1\n' > "$WORK/metadata.yaml"
printf '{}' > "$WORK/empty.json"
LAYER="$(push_blob "$WORK/metadata.yaml")"
EMPTY="$(push_blob "$WORK/empty.json")"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.clusterstack.release","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"%s","size":2,"data":"e30="},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%d,"annotations":{"org.opencontainers.image.title":"metadata.yaml"}}]}' \
  "$EMPTY" "$LAYER" "$(stat -c %s "$WORK/metadata.yaml")" > "$WORK/subject.json"
curl -fs -o /dev/null -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' \
  --data-binary "@$WORK/subject.json" "$API/manifests/docker-scs-1-35-v1"
DIGEST="sha256:$(sha256sum "$WORK/subject.json" | cut -c1-64)"
HEX="${DIGEST#sha256:}"
REF="$HOST/$REPO@$DIGEST"
say "release $REPO:docker-scs-1-35-v1 = $DIGEST"

rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
cp "$WORK/subject.json" "$OUT.tmp/subject-manifest.json"
printf '%s' "$DIGEST" > "$OUT.tmp/subject-digest.txt"

# --- keys: P-256 from cosign; P-384, RSA 2048 and Ed25519 from openssl, imported ---
cosign generate-key-pair --output-key-prefix "$WORK/key1" >/dev/null 2>&1
cosign generate-key-pair --output-key-prefix "$WORK/key2" >/dev/null 2>&1
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out "$WORK/p384.pem" 2>/dev/null
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$WORK/rsa.pem" 2>/dev/null
openssl genpkey -algorithm ed25519 -out "$WORK/ed25519.pem" 2>/dev/null
for name in p384 rsa ed25519; do
  cosign import-key-pair --key "$WORK/$name.pem" --output-key-prefix "$WORK/$name" >/dev/null 2>&1
done
for name in key1 key2 p384 rsa ed25519; do cp "$WORK/$name.pub" "$OUT.tmp/$name.pub"; done

sign() { cosign sign --key "$WORK/$1.key" --tlog-upload=false --use-signing-config=false --allow-http-registry --yes "${@:2}" "$REF" >/dev/null 2>&1; }
verify() { cosign verify --key "$WORK/$1.pub" --insecure-ignore-tlog --allow-http-registry "${@:2}" "$REF" >/dev/null 2>&1; }
# newest_bundle PREFIX: the referrer that the last signature added (the index entry not seen before: cosign keeps
# the entries sorted by digest, not in the order they came) and its bundle blob.
touch "$WORK/seen"
newest() { python3 -c 'import sys; seen = set(open(sys.argv[1]).read().split()); new = [x for x in sys.argv[2:] if x not in seen]; assert len(new) == 1, new; open(sys.argv[1], "a").write(new[0] + "\n"); print(new[0])' "$WORK/seen" "$@"; }
newest_bundle() {
  get_manifest "sha256-$HEX" > "$WORK/index.json"
  local manifest layer
  # shellcheck disable=SC2046
  manifest="$(newest $(json "$WORK/index.json" '" ".join(m["digest"] for m in d["manifests"])'))"
  get_manifest "$manifest" > "$OUT.tmp/$1manifest.json"
  layer="$(json "$OUT.tmp/$1manifest.json" 'd["layers"][0]["digest"]')"
  get_blob "$layer" > "$OUT.tmp/${1%-}.json"
}
# newest_legacy PREFIX: the signature annotation of the `.sig` manifest's layer not seen before.
newest_legacy() {
  get_manifest "sha256-$HEX.sig" > "$WORK/sig.json"
  # shellcheck disable=SC2046
  newest $(json "$WORK/sig.json" '" ".join(l["annotations"]["dev.cosignproject.cosign/signature"] for l in d["layers"])') \
    | tr -d '\n' > "$OUT.tmp/$1legacy-signature.txt"
}
must() { "$@" || { echo "cosign-fixtures: failed: $*" >&2; exit 1; }; }
must_not() { if "$@"; then echo "cosign-fixtures: unexpectedly passed: $*" >&2; exit 1; fi; }

# key1, both layouts: the main fixtures, saved before any other key signs (one index entry, one layer).
must sign key1
must sign key1 --new-bundle-format=false
must verify key1
must verify key1 --new-bundle-format=false
must_not verify key2
must_not verify key2 --new-bundle-format=false
get_manifest "sha256-$HEX" > "$OUT.tmp/bundle-index.json"
newest_bundle bundle-
get_manifest "sha256-$HEX.sig" > "$OUT.tmp/legacy-manifest.json"
get_blob "$(json "$OUT.tmp/legacy-manifest.json" 'd["layers"][0]["digest"]')" > "$OUT.tmp/legacy-payload.json"
get_blob "$(json "$OUT.tmp/legacy-manifest.json" 'd["config"]["digest"]')" > "$OUT.tmp/legacy-config.json"
newest_legacy ""
say "key1: bundle and legacy signature saved; key2 refused"

# The other keys sign the same manifest after key1: their bundles and legacy signatures (the legacy payload is the
# same blob for every key).
for name in p384 rsa ed25519; do
  must sign "$name"
  must sign "$name" --new-bundle-format=false
  newest_bundle "$name-bundle-"
  rm "$OUT.tmp/$name-bundle-manifest.json"
  newest_legacy "$name-"
done
# What `cosign verify` makes of them: P-384 is signed with SHA-384 and RSA with PKCS#1 v1.5 SHA-256 (verify
# needs `--signature-digest-algorithm` for anything but SHA-256); Ed25519 is signed as Ed25519ph, which `cosign
# verify --key` refuses.
must verify p384 --signature-digest-algorithm=sha384
must verify p384 --signature-digest-algorithm=sha384 --new-bundle-format=false
must_not verify p384
must verify rsa
must verify rsa --new-bundle-format=false
must_not verify ed25519
must_not verify ed25519 --new-bundle-format=false
get_manifest "sha256-$HEX" > "$OUT.tmp/bundle-index-all.json"
get_manifest "sha256-$HEX.sig" > "$OUT.tmp/legacy-manifest-all.json"
curl -fs "$API/tags/list" > "$OUT.tmp/tags.json"
say "p384, rsa, ed25519: signed; cosign verified p384 (sha384) and rsa, refused ed25519 (Ed25519ph)"

# --- GitHub releases: `cosign sign-blob` of a checksum file, bundle and bare signature ---
mkdir -p "$OUT.tmp/github"
cp "$WORK/metadata.yaml" "$OUT.tmp/github/metadata.yaml"
printf '{"hashes":{}}\n' > "$OUT.tmp/github/hashes.json"
(cd "$OUT.tmp/github" && sha256sum hashes.json metadata.yaml > checksums.txt)
# (With the new bundle format, the default, `--output-signature` writes nothing: the bare signature is a second
# signing in the old format.)
must cosign sign-blob --key "$WORK/key1.key" --tlog-upload=false --use-signing-config=false --yes \
  --bundle "$OUT.tmp/github/checksums.txt.sigstore.json" "$OUT.tmp/github/checksums.txt" >/dev/null 2>&1
must cosign sign-blob --key "$WORK/key1.key" --tlog-upload=false --use-signing-config=false --yes \
  --new-bundle-format=false --output-signature "$OUT.tmp/github/checksums.txt.sig" \
  "$OUT.tmp/github/checksums.txt" >/dev/null 2>&1
chmod 644 "$OUT.tmp/github/"*
must cosign verify-blob --key "$WORK/key1.pub" --insecure-ignore-tlog --signature "$OUT.tmp/github/checksums.txt.sig" \
  --new-bundle-format=false "$OUT.tmp/github/checksums.txt" >/dev/null 2>&1
must cosign verify-blob --key "$WORK/key1.pub" --insecure-ignore-tlog --bundle "$OUT.tmp/github/checksums.txt.sigstore.json" \
  "$OUT.tmp/github/checksums.txt" >/dev/null 2>&1
must_not cosign verify-blob --key "$WORK/key2.pub" --insecure-ignore-tlog --bundle "$OUT.tmp/github/checksums.txt.sigstore.json" \
  "$OUT.tmp/github/checksums.txt" >/dev/null 2>&1
say "github: checksums.txt signed with key1 (bundle and bare signature)"

printf 'cosign %s; %s; registry 127.0.0.1:%s (docker-registry %s)\n' \
  "$(cosign version 2>/dev/null | awk '/GitVersion/ { print $2 }')" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$PORT" \
  "$("$REGISTRY_BIN" --version 2>/dev/null | awk '{ print $3 }')" > "$OUT.tmp/made-by.txt"
# Keep the hand-written README.
if [[ -f "$OUT/README.md" ]]; then cp "$OUT/README.md" "$OUT.tmp/README.md"; fi
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
say "written to $OUT"
