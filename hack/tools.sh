#!/usr/bin/env bash
# Installs the tools the tests and `cso-dev up` need, cached outside the repo.
#
#   kube-apiserver  built from the k8s.io/kubernetes Go module (wrapper module hack/testenv/kubernetes, whose `tool`
#                   directives name upstream's main packages); the API server of every local control plane
#   kube-controller-manager, kube-scheduler
#                   the same module and version, stamped the same way: with kwok they make a workload control plane
#                   run workloads (crates/testenv/src/workloads.rs: Deployments, DaemonSets, Jobs get a real status).
#                   Measured cold on 2 cores, right after kube-apiserver (whose build cache they share, as here):
#                   72 s + 5 s, +570 MiB build cache, +30 MiB modules, binaries 89 + 68 MiB, peak 1.8 GiB memory;
#                   without kube-apiserver before them: 6.2 minutes, 2.6 GiB build cache
#   kwok            sigs.k8s.io/kwok/cmd/kwok (the controller, not kwokctl) from the wrapper module hack/testenv/kwok
#                   (its go.mod holds the version, v0.8.0): simulated nodes, and pods bound to them that go Running,
#                   Ready and (a Job's) Succeeded. Measured cold: 100-135 s, +650-800 MiB build cache, +300 MiB
#                   modules (it is on Kubernetes 1.36's libraries), binary 61 MiB, peak 0.9 GiB memory
#   cosign          github.com/sigstore/cosign/v3/cmd/cosign from the wrapper module hack/testenv/cosign (its go.mod
#                   holds the version, v3.1.3): signs releases in a loopback registry for the release-verification
#                   tests (crates/testenv/src/cosign.rs) and made the verifier's fixtures (hack/cosign-fixtures.sh).
#                   Measured on 2 cores: 185 s with a cold build cache (+1.3 GiB), 121 s after the tools above
#                   (+1.0 GiB build cache); +1.3 GiB modules (mostly Azure's and Google's cloud SDKs, for KMS keys;
#                   `go get` + `tidy` of the wrapper: 21 s), binary 97 MiB, not version-stamped (`cosign version`
#                   reads v3.1.3 from the build info)
#   helm            built from helm.sh/helm/v3 on the Go module proxy (what the image ships)
#   helm 4          built from helm.sh/helm/v4, for the tests that run helm, run a second time with it
#   CAPI CRDs       the sigs.k8s.io/cluster-api modules, downloaded into the Go module cache
#   CAPI managers   Cluster API's core manager, kubeadm bootstrap and control-plane providers and the Docker/Dev
#                   infrastructure provider, built from the wrapper module hack/testenv/capi (its go.mod holds the
#                   version, v1.14.x); cold: ~5 minutes for all four, 1.2 GiB
#   clusterctl      Cluster API's CLI of the same release and wrapper module (sigs.k8s.io/cluster-api/cmd/clusterctl,
#                   stamped as the managers are), for `clusterctl move` between two management control planes
#                   (crates/testenv/src/clusterctl.rs); 25 s after the managers (measured on 2 cores, warm build
#                   cache; 136 s alone with an empty build cache, modules downloaded), 33 MiB; not in `install --for demo`; `hack/tools.sh clusterctl` builds it alone and
#                   rewrites the environment file
#   kubelet, kube-proxy
#                   the same module and version as kube-apiserver, stamped the same way: real nodes
#                   (crates/testenv/src/node.rs); after kube-apiserver, warm build cache: ~30 s + ~10 s
#   pause           the sandbox image: build/pause/linux/pause.c of the k8s.io/kubernetes module, compiled statically
#                   with the machine's gcc and packed as a one-layer OCI archive (hack/oci-archive.py) named
#                   registry.k8s.io/pause:$PAUSE_VERSION, the kubelet's default; seconds
#   containerd, runc, CNI plugins
#                   Debian's packages (containerd 1.6, runc 1.1, containernetworking-plugins 1.1): the real nodes'
#                   runtime; their system services are not started (each node runs its own containerd)
#   cert-manager    its CRDs, from the github.com/cert-manager/cert-manager module (for the chart test)
#   etcd            comes from the crates.io crate etcd-bin-vendored-linux-amd64 (built by cargo, nothing to do here)
#   docker-registry Debian's CNCF distribution registry, for the OCI tests
#   prometheus      Debian's `prometheus` package (2.42): `promtool` checks and unit-tests the chart's alert rules,
#                   and the server scrapes `cso run` in crates/cso/tests/observability.rs (its system service is
#                   stopped; the test runs its own on loopback)
#   cso-renderer    hack/renderer: cso's long-lived renderer on Helm's own engine (helm.sh/helm/v3 $HELM_VERSION's
#                   packages), what the image ships beside helm; rebuilt when its sources change; ~1 minute cold;
#                   linked into target/debug/ and target/release/, beside the cso cargo builds (where `cso run` looks)
#   yaml2json       a few lines of Go over sigs.k8s.io/yaml (go-yaml v2) and k8s.io/apimachinery's YAMLReader, the
#                   YAML parsing of Helm 3, kubectl and the Go operator: the reference of the manifest parser's
#                   differential test (crates/render/tests/yaml_parity.rs); ~15 s cold, modules from the proxy
#
# Idempotent: each tool is built only when its cached binary is missing. A cold kube-apiserver build takes
# 5-20 minutes and 2-4 GiB of memory on 2 cores (measured: 4.8 minutes, peak 1.7 GiB, 2.1 GiB build cache and
# 530 MiB of modules); with a warm cache this script finishes in seconds. kube-apiserver, kube-controller-manager,
# kube-scheduler and kwok together, cold: ~8 minutes, 3.3 GiB of Go build cache, 860 MiB of modules, 320 MiB of
# binaries.
#
# `install --for demo` (`make demo`) builds only what the demo runs: cso-renderer, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok and the Cluster API managers. Cold on 2 cores, from the per-tool
# times of one cold `install` (2026-11-26, one build cache, beside a cargo build): 271 + 82 + 7 s (Kubernetes),
# 105 s (kwok), 147 + 7 + 11 + 46 s (Cluster API), ~70 s (cso-renderer without helm's build cache; 4 s after helm):
# ~12.5 minutes, against ~18 minutes for everything (helm 3 70 s, helm 4 124 s, cosign 193 s, yaml2json, the
# registry and the CRD modules are left out).
# Prints the environment (`KEY=value` lines) that the tests and `cso-dev` read when called with --env: the tools
# that are built (an absent one is left out).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
HELM_VERSION="${HELM_VERSION:-v3.20.2}"
HELM4_VERSION="${HELM4_VERSION:-v4.3.1}"
CAPI_VERSION="${CAPI_VERSION:-v1.10.4}"
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.16.2}"
CACHE="${CSO_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cso}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

K8S_DIR="$CACHE/k8s-$K8S_VERSION"
KUBE_APISERVER="$K8S_DIR/kube-apiserver"
KUBE_CONTROLLER_MANAGER="$K8S_DIR/kube-controller-manager"
KUBE_SCHEDULER="$K8S_DIR/kube-scheduler"
KUBELET="$K8S_DIR/kubelet"
KUBE_PROXY="$K8S_DIR/kube-proxy"
# The sandbox image the kubelet of $K8S_VERSION names by default (build/pause/Makefile's TAG).
PAUSE_VERSION=3.10.1
PAUSE_IMAGE="$CACHE/pause-$PAUSE_VERSION/pause.tar"
# A test image of this project's: Debian's static busybox (its applets linked in /bin), named under cso.test.
BUSYBOX_IMAGE="$CACHE/test-images/busybox.tar"
# Cluster DNS of the real nodes: CoreDNS of the wrapper module (only a cluster DNS's plugins), as an image.
COREDNS_VERSION="$(awk '$1 == "github.com/coredns/coredns" { print $2 }' "$ROOT/hack/testenv/coredns/go.mod")"
# Named after a digest of the wrapper's main.go too: its plugin list is ours, and a change there builds it again.
COREDNS_IMAGE="$CACHE/coredns-$COREDNS_VERSION-$(sha256sum "$ROOT/hack/testenv/coredns/main.go" | cut -c1-8)/coredns.tar"
# The ferrol stacks' addon images (issue 39), built from their Go sources under exactly the names the charts use:
# metrics-server at the version of its wrapper module, kindnetd from its source at the image's commit with the
# machine's iptables (in the mode the nodes' kube-proxy uses), and this project's web server, which the workload
# clusters run where a stack asks for nginx.
METRICS_SERVER_VERSION="$(awk '$1 == "sigs.k8s.io/metrics-server" { print $2 }' "$ROOT/hack/testenv/metrics-server/go.mod")"
# What upstream's release build of that version stamps (its Makefile's LDFLAGS): change them with the version.
METRICS_SERVER_COMMIT=6242212f633d50d6066d2fe95f221b052ef4e1ae
METRICS_SERVER_BUILD_DATE=2023-07-25T10:08:06Z
METRICS_SERVER_IMAGE="$CACHE/addon-images/metrics-server-$METRICS_SERVER_VERSION-$(cat "$ROOT"/hack/testenv/metrics-server/go.* | sha256sum | cut -c1-8).tar"
KINDNETD_TAG=v20230511-dc714da8
# The machine's iptables goes into the image: its mode and version are part of the key. Asked each time, not
# once at the start: a fresh machine's `make tools` installs iptables on the way.
kindnetd_image() {
  local iptables
  iptables="$(basename "$(readlink -f "$(command -v iptables 2>/dev/null || echo none)")") $(iptables --version 2>/dev/null || true)"
  echo "$CACHE/addon-images/kindnetd-$KINDNETD_TAG-$( (cat "$ROOT"/hack/testenv/kindnetd/go.* "$ROOT"/hack/testenv/kindnetd/cmd/kindnetd/*.go; echo "$iptables") | sha256sum | cut -c1-8).tar"
}
WEB_IMAGE="$CACHE/test-images/web-$(cat "$ROOT"/hack/testenv/web/go.mod "$ROOT"/hack/testenv/web/main.go | sha256sum | cut -c1-8).tar"
# kwok: the version is the one the wrapper module requires.
KWOK_VERSION="$(awk '$1 == "sigs.k8s.io/kwok" { print $2 }' "$ROOT/hack/testenv/kwok/go.mod")"
KWOK="$CACHE/kwok-$KWOK_VERSION/kwok"
# cosign: the version is the one the wrapper module requires.
COSIGN_VERSION="$(awk '$1 == "github.com/sigstore/cosign/v3" { print $2 }' "$ROOT/hack/testenv/cosign/go.mod")"
COSIGN="$CACHE/cosign-$COSIGN_VERSION/cosign"
HELM="$CACHE/helm-$HELM_VERSION/helm"
HELM4="$CACHE/helm-$HELM4_VERSION/helm"
# The Cluster API managers: the version is the one the wrapper module requires.
CAPI_MANAGER_VERSION="$(awk '$1 == "sigs.k8s.io/cluster-api" { print $2 }' "$ROOT/hack/testenv/capi/go.mod")"
CAPI_MANAGER_DIR="$CACHE/capi-$CAPI_MANAGER_VERSION"
# The helper's modules are Helm $HELM_VERSION's (sigs.k8s.io/yaml, go.yaml.in/yaml/v2); bump the revision when
# build_yaml2json's source changes.
YAML2JSON="$CACHE/yaml2json-r1/yaml2json"
# The renderer's directory is named after a digest of its sources: a change there builds it again.
RENDERER="$CACHE/renderer-$(cat "$ROOT/hack/renderer/go.mod" "$ROOT/hack/renderer/go.sum" "$ROOT/hack/renderer/main.go" | sha256sum | cut -c1-12)/cso-renderer"

say() { printf '[tools] %s\n' "$*" >&2; }

# print_tool KEY PATH: `KEY=PATH` when PATH is built; a tool that is not is left out, so that the tests and
# `cso-dev` find it missing (and say `run make tools`) instead of running a path that is not there.
print_tool() { if [[ -x "$2" ]]; then echo "$1=$2"; fi; }

# module_dir MODULE@VERSION: the module's directory in the Go module cache, downloaded when missing; with
# MODULES_OFFLINE=1 (`install --for demo`) nothing is downloaded and a module that is not there prints nothing.
module_dir() {
  local json
  if [[ "${MODULES_OFFLINE:-0}" == 1 ]]; then
    json="$(GOPROXY=off GONOSUMDB=sigs.k8s.io/cluster-api/test go mod download -json "$1" 2>/dev/null)" || return 0
  else
    json="$(GONOSUMDB=sigs.k8s.io/cluster-api/test go mod download -json "$1")"
  fi
  python3 -c 'import json,sys; print(json.load(sys.stdin).get("Dir", ""))' <<<"$json"
}

print_env() {
  local capi_dir capi_test_dir cert_manager_dir
  capi_dir="$(module_dir "sigs.k8s.io/cluster-api@$CAPI_VERSION")"
  capi_test_dir="$(module_dir "sigs.k8s.io/cluster-api/test@$CAPI_VERSION")"
  cert_manager_dir="$(module_dir "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")"
  print_tool CSO_KUBE_APISERVER "$KUBE_APISERVER"
  print_tool CSO_KUBE_CONTROLLER_MANAGER "$KUBE_CONTROLLER_MANAGER"
  print_tool CSO_KUBE_SCHEDULER "$KUBE_SCHEDULER"
  print_tool CSO_KWOK "$KWOK"
  print_tool CSO_KUBELET "$KUBELET"
  print_tool CSO_KUBE_PROXY "$KUBE_PROXY"
  if [[ -f "$PAUSE_IMAGE" ]]; then echo "CSO_PAUSE_IMAGE=$PAUSE_IMAGE"; fi
  if [[ -f "$BUSYBOX_IMAGE" ]]; then echo "CSO_BUSYBOX_IMAGE=$BUSYBOX_IMAGE"; fi
  if [[ -f "$COREDNS_IMAGE" ]]; then echo "CSO_COREDNS_IMAGE=$COREDNS_IMAGE"; fi
  if [[ -f "$METRICS_SERVER_IMAGE" ]]; then echo "CSO_METRICS_SERVER_IMAGE=$METRICS_SERVER_IMAGE"; fi
  local kindnetd_image
  kindnetd_image="$(kindnetd_image)"
  if [[ -f "$kindnetd_image" ]]; then echo "CSO_KINDNETD_IMAGE=$kindnetd_image"; fi
  if [[ -f "$WEB_IMAGE" ]]; then echo "CSO_WEB_IMAGE=$WEB_IMAGE"; fi
  if command -v containerd >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && [[ -x /usr/lib/cni/bridge ]]; then
    echo "CSO_CONTAINERD=$(command -v containerd)"
    echo "CSO_CNI_BIN_DIR=/usr/lib/cni"
  fi
  print_tool CSO_COSIGN "$COSIGN"
  if [[ -n "$cert_manager_dir" ]]; then echo "CSO_CERT_MANAGER_CRD_DIR=$cert_manager_dir/deploy/crds"; fi
  print_tool CSO_HELM "$HELM"
  print_tool CSO_HELM4 "$HELM4"
  print_tool CSO_YAML2JSON "$YAML2JSON"
  print_tool CSO_RENDERER "$RENDERER"
  if [[ -n "$capi_dir" && -n "$capi_test_dir" ]]; then
    echo "CSO_CAPI_CRD_DIRS=$capi_dir/config/crd/bases:$capi_dir/bootstrap/kubeadm/config/crd/bases:$capi_dir/controlplane/kubeadm/config/crd/bases:$capi_test_dir/infrastructure/docker/config/crd/bases"
  fi
  if command -v docker-registry >/dev/null 2>&1; then echo "CSO_REGISTRY=$(command -v docker-registry)"; fi
  if command -v promtool >/dev/null 2>&1; then echo "CSO_PROMTOOL=$(command -v promtool)"; fi
  if command -v prometheus >/dev/null 2>&1; then echo "CSO_PROMETHEUS=$(command -v prometheus)"; fi
  print_capi_manager_env
}

# build_kubernetes: kube-apiserver, kube-controller-manager and kube-scheduler of the wrapper module
# hack/testenv/kubernetes, each built when its binary is missing, version-stamped as upstream's release builds are.
build_kubernetes() {
  build_kubernetes_binaries kube-apiserver kube-controller-manager kube-scheduler
}

# build_kubernetes_binaries NAME...: `k8s.io/kubernetes/cmd/NAME` of the wrapper module, each built when its binary
# is missing, version-stamped as upstream's release builds are.
build_kubernetes_binaries() {
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w" pkg name target start
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  done
  for name in "$@"; do
    target="$K8S_DIR/$name"
    if [[ -x "$target" ]]; then say "$name $K8S_VERSION: cached at $target"; continue; fi
    case "$name" in
      kube-apiserver) say "$name $K8S_VERSION: building from the Go module proxy (cold: 5-20 minutes, 2-4 GiB; warm: ~1 minute)" ;;
      *) say "$name $K8S_VERSION: building from the Go module proxy (cold, after kube-apiserver: about a minute)" ;;
    esac
    mkdir -p "$K8S_DIR"
    start=$SECONDS
    (cd "$ROOT/hack/testenv/kubernetes" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 \
      go build -trimpath -ldflags "$ld" -o "$target.tmp" "k8s.io/kubernetes/cmd/$name")
    mv "$target.tmp" "$target"
    say "$name: built in $((SECONDS - start))s"
  done
}

# build_node_tools: what a real node runs (crates/testenv/src/node.rs): kubelet and kube-proxy of the wrapper module,
# Debian's containerd, runc and CNI plugins, and the pause image built here.
build_node_tools() {
  build_kubernetes_binaries kubelet kube-proxy
  if command -v containerd >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && [[ -x /usr/lib/cni/bridge ]] \
    && [[ -x /bin/busybox ]] && command -v musl-gcc >/dev/null 2>&1; then
    say "containerd, runc, CNI plugins, busybox, musl-tools: installed"
  elif [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    say "containerd, runc, CNI plugins: not installed and cannot apt-get them here; the real-node tests will fail"
  else
    say "containerd, runc, CNI plugins: installing Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd runc \
      containernetworking-plugins busybox-static musl-tools >/dev/null
    # No system service: each node runs a containerd of its own.
    (systemctl disable --now containerd >/dev/null 2>&1 || service containerd stop >/dev/null 2>&1 || true)
  fi
  if [[ -f "$BUSYBOX_IMAGE" ]]; then say "busybox test image: cached at $BUSYBOX_IMAGE"
  elif [[ -x /bin/busybox ]]; then
    local rootfs applet
    rootfs="$(mktemp -d)"
    mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/www"
    cp /bin/busybox "$rootfs/bin/busybox"
    for applet in $(/bin/busybox --list); do [[ "$applet" == busybox ]] || ln -s busybox "$rootfs/bin/$applet"; done
    python3 "$ROOT/hack/oci-archive.py" "$rootfs" "$BUSYBOX_IMAGE" --name "cso.test/busybox:debian-12" \
      --env PATH=/bin --cmd '["/bin/sh"]' >/dev/null
    rm -rf "$rootfs"
    say "busybox test image: $BUSYBOX_IMAGE"
  fi
  build_coredns_image
  build_pause_image
  # Best effort, in a process of its own (so that `set -e` holds inside): without them real nodes still run,
  # only the stack's addons cannot.
  bash "${BASH_SOURCE[0]}" addon-images \
    || say "the addon images could not be built: real nodes run, the ferrol stack's addons cannot run on them"
}

# build_pause_image: the sandbox image every real node needs, compiled from the kubernetes module's pause.c.
build_pause_image() {
  if [[ -f "$PAUSE_IMAGE" ]]; then say "pause $PAUSE_VERSION: cached at $PAUSE_IMAGE"; return; fi
  say "pause $PAUSE_VERSION: compiling build/pause/linux/pause.c of k8s.io/kubernetes $K8S_VERSION"
  local source work
  source="$(module_dir "k8s.io/kubernetes@$K8S_VERSION")/build/pause/linux/pause.c"
  work="$(mktemp -d)"
  mkdir -p "$work/rootfs" "$(dirname "$PAUSE_IMAGE")"
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-cso" -o "$work/rootfs/pause" "$source"
  python3 "$ROOT/hack/oci-archive.py" "$work/rootfs" "$PAUSE_IMAGE" --name "registry.k8s.io/pause:$PAUSE_VERSION" \
    --user 65535:65535 --entrypoint '["/pause"]' >/dev/null
  rm -rf "$work"
  say "pause: $PAUSE_IMAGE"
}

# write_env: the environment file, replaced at once (a test starting meanwhile reads the old file or the new one,
# never a part; two runs side by side each write a whole file).
write_env() {
  local tmp
  tmp="$(mktemp -p "$CACHE" env.XXXXXX)"
  print_env > "$tmp"
  mv "$tmp" "$CACHE/env"
}

# build_coredns_image: the real nodes' cluster DNS, CoreDNS of the wrapper module hack/testenv/coredns, static, on an
# empty file system as user 65532, named under cso.test (it is not upstream's image: fewer plugins).
build_coredns_image() {
  if [[ -f "$COREDNS_IMAGE" ]]; then say "coredns $COREDNS_VERSION image: cached at $COREDNS_IMAGE"; return; fi
  say "coredns $COREDNS_VERSION: building from the Go module proxy (cold: about 2 minutes)"
  local start=$SECONDS work
  work="$(mktemp -d)"
  mkdir -p "$work/rootfs" "$(dirname "$COREDNS_IMAGE")"
  (cd "$ROOT/hack/testenv/coredns" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w" -o "$work/rootfs/coredns" .)
  python3 "$ROOT/hack/oci-archive.py" "$work/rootfs" "$COREDNS_IMAGE.tmp" --name "cso.test/coredns:$COREDNS_VERSION" \
    --user 65532:65532 --entrypoint '["/coredns"]' >/dev/null
  mv "$COREDNS_IMAGE.tmp" "$COREDNS_IMAGE"
  rm -rf "$work"
  say "coredns: $COREDNS_IMAGE in $((SECONDS - start))s"
}

# build_addon_images: the images the ferrol stacks' addons name, and this project's web server (see METRICS_SERVER_IMAGE).
build_addon_images() {
  local start work
  if [[ -f "$METRICS_SERVER_IMAGE" ]]; then say "metrics-server $METRICS_SERVER_VERSION image: cached at $METRICS_SERVER_IMAGE"
  else
    say "metrics-server $METRICS_SERVER_VERSION: building from the Go module proxy (cold: about 3 minutes)"
    start=$SECONDS work="$(mktemp -d)"
    mkdir -p "$work/rootfs" "$(dirname "$METRICS_SERVER_IMAGE")"
    # Stamped as upstream's release build stamps it (its Makefile's LDFLAGS), so that its version reads the same.
    (cd "$ROOT/hack/testenv/metrics-server" && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 \
      go build -trimpath -ldflags "-s -w -X k8s.io/client-go/pkg/version.gitVersion=$METRICS_SERVER_VERSION \
        -X k8s.io/client-go/pkg/version.gitCommit=$METRICS_SERVER_COMMIT \
        -X k8s.io/client-go/pkg/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.buildDate=$METRICS_SERVER_BUILD_DATE" \
      -o "$work/rootfs/metrics-server" sigs.k8s.io/metrics-server/cmd/metrics-server)
    python3 "$ROOT/hack/oci-archive.py" "$work/rootfs" "$METRICS_SERVER_IMAGE.tmp" \
      --name "registry.k8s.io/metrics-server/metrics-server:$METRICS_SERVER_VERSION" --user 65534:65534 \
      --entrypoint '["/metrics-server"]' >/dev/null
    mv "$METRICS_SERVER_IMAGE.tmp" "$METRICS_SERVER_IMAGE"
    rm -rf "$work"
    say "metrics-server: $METRICS_SERVER_IMAGE in $((SECONDS - start))s"
  fi
  local KINDNETD_IMAGE
  KINDNETD_IMAGE="$(kindnetd_image)"
  if [[ -f "$KINDNETD_IMAGE" ]]; then say "kindnetd $KINDNETD_TAG image: cached at $KINDNETD_IMAGE"
  elif ! command -v iptables >/dev/null 2>&1; then say "kindnetd: needs the machine's iptables (install_network_tools)"
  else
    say "kindnetd $KINDNETD_TAG: building from its source (cold: about 2 minutes)"
    start=$SECONDS work="$(mktemp -d)"
    # The machine's layout of the top directories (on a merged /usr, /lib is a link to usr/lib), so that every
    # path a library or iptables itself names means the same file in the image.
    mkdir -p "$work/rootfs/usr"
    local top
    for top in bin sbin lib lib64; do
      if [[ -L "/$top" ]]; then
        mkdir -p "$work/rootfs/$(readlink "/$top")"
        ln -s "$(readlink "/$top")" "$work/rootfs/$top"
      fi
    done
    mkdir -p "$work/rootfs/bin/" "$work/rootfs/usr/sbin" "$work/rootfs/run" "$(dirname "$KINDNETD_IMAGE")"
    (cd "$ROOT/hack/testenv/kindnetd" && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 \
      go build -trimpath -ldflags "-s -w" -o "$work/rootfs/bin/kindnetd" ./cmd/kindnetd)
    # iptables as upstream's image carries it (distroless-iptables): the machine's, in the mode the nodes'
    # kube-proxy uses, with its libraries and extensions.
    local multi extensions so name
    multi="$(readlink -f "$(command -v iptables)")"
    copy_with_libraries "$multi" "$work/rootfs"
    # Its extensions (`-m comment`, `-j MASQUERADE`, ...) beside libxtables, wherever this machine has it.
    extensions="$(readlink -f "$(dirname "$(ldd "$multi" | awk '/libxtables/ { print $3 }')")/xtables")"
    [[ -d "$extensions" ]] || { say "kindnetd: no iptables extensions at $extensions"; exit 1; }
    for so in "$extensions"/*.so; do copy_with_libraries "$so" "$work/rootfs"; done
    for name in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
      ln -sf "$multi" "$work/rootfs/usr/sbin/$name"
    done
    # What kindnet runs, run in the image's file system: the extensions it uses load.
    chroot "$work/rootfs" /usr/sbin/iptables -m comment --help >/dev/null
    chroot "$work/rootfs" /usr/sbin/iptables -j MASQUERADE --help >/dev/null
    python3 "$ROOT/hack/oci-archive.py" "$work/rootfs" "$KINDNETD_IMAGE.tmp" --name "docker.io/kindest/kindnetd:$KINDNETD_TAG" \
      --env PATH=/usr/sbin:/usr/bin:/sbin:/bin --cmd '["/bin/kindnetd"]' >/dev/null
    mv "$KINDNETD_IMAGE.tmp" "$KINDNETD_IMAGE"
    rm -rf "$work"
    say "kindnetd: $KINDNETD_IMAGE ($(basename "$multi")) in $((SECONDS - start))s"
  fi
  if [[ -f "$WEB_IMAGE" ]]; then say "web test image: cached at $WEB_IMAGE"
  else
    start=$SECONDS work="$(mktemp -d)"
    mkdir -p "$work/rootfs" "$(dirname "$WEB_IMAGE")"
    (cd "$ROOT/hack/testenv/web" && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w" -o "$work/rootfs/web" .)
    python3 "$ROOT/hack/oci-archive.py" "$work/rootfs" "$WEB_IMAGE.tmp" --name "cso.test/web:v1" --user 65532:65532 \
      --entrypoint '["/web"]' >/dev/null
    mv "$WEB_IMAGE.tmp" "$WEB_IMAGE"
    rm -rf "$work"
    say "web test image: $WEB_IMAGE in $((SECONDS - start))s"
  fi
}

# copy_with_libraries FILE ROOTFS: FILE at its path under ROOTFS (as a file, whatever links lead to it), with every
# shared library it loads (and the loader).
copy_with_libraries() {
  local file="$1" rootfs="$2" lib
  mkdir -p "$rootfs$(dirname "$file")"
  cp -L --remove-destination "$file" "$rootfs$file"
  for lib in $(ldd "$file" 2>/dev/null | grep -o '/[^ ]*'); do
    [[ -e "$rootfs$lib" ]] && continue
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
}

# build_kwok: kwok of the wrapper module hack/testenv/kwok, stamped with its version as kwok's releases are (the
# simulated nodes report `kwok-<version>` as their kubelet version).
build_kwok() {
  if [[ -x "$KWOK" ]]; then say "kwok $KWOK_VERSION: cached at $KWOK"; return; fi
  say "kwok $KWOK_VERSION: building from the Go module proxy (cold: about 2 minutes)"
  local start=$SECONDS
  mkdir -p "$(dirname "$KWOK")"
  (cd "$ROOT/hack/testenv/kwok" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$KWOK.tmp" sigs.k8s.io/kwok/cmd/kwok)
  mv "$KWOK.tmp" "$KWOK"
  say "kwok: built in $((SECONDS - start))s"
}

# build_cosign: cosign of the wrapper module hack/testenv/cosign. Not stamped: release-utils reads the version from
# the module's build info, so `cosign version` reports the required version as it is.
build_cosign() {
  if [[ -x "$COSIGN" ]]; then say "cosign $COSIGN_VERSION: cached at $COSIGN"; return; fi
  say "cosign $COSIGN_VERSION: building from the Go module proxy (cold: about 3 minutes)"
  local start=$SECONDS
  mkdir -p "$(dirname "$COSIGN")"
  (cd "$ROOT/hack/testenv/cosign" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w" -o "$COSIGN.tmp" github.com/sigstore/cosign/v3/cmd/cosign)
  mv "$COSIGN.tmp" "$COSIGN"
  say "cosign: built in $((SECONDS - start))s"
}

# The Cluster API managers' binaries and the config directories (CRDs, kustomization labels and patches, webhook
# manifests) of the same version, as crates/testenv/src/capi.rs reads them.
print_capi_manager_env() {
  local dir test_dir
  dir="$(go mod download -json "sigs.k8s.io/cluster-api@$CAPI_MANAGER_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  test_dir="$(GONOSUMDB=sigs.k8s.io/cluster-api/test go mod download -json "sigs.k8s.io/cluster-api/test@$CAPI_MANAGER_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  echo "CSO_CAPI_MANAGER_VERSION=$CAPI_MANAGER_VERSION"
  echo "CSO_CAPI_MANAGER=$CAPI_MANAGER_DIR/cluster-api-manager"
  echo "CSO_CAPI_MANAGER_CONFIG=$dir/core/config"
  echo "CSO_CAPI_KUBEADM_BOOTSTRAP_MANAGER=$CAPI_MANAGER_DIR/kubeadm-bootstrap-manager"
  echo "CSO_CAPI_KUBEADM_BOOTSTRAP_CONFIG=$dir/bootstrap/kubeadm/config"
  echo "CSO_CAPI_KUBEADM_CONTROL_PLANE_MANAGER=$CAPI_MANAGER_DIR/kubeadm-control-plane-manager"
  echo "CSO_CAPI_KUBEADM_CONTROL_PLANE_CONFIG=$dir/controlplane/kubeadm/config"
  echo "CSO_CAPI_DOCKER_MANAGER=$CAPI_MANAGER_DIR/capd-manager"
  echo "CSO_CAPI_DOCKER_CONFIG=$test_dir/infrastructure/docker/config"
  echo "CSO_CAPI_MANAGER_CRD_DIRS=$dir/core/config/crd/bases:$dir/bootstrap/kubeadm/config/crd/bases:$dir/controlplane/kubeadm/config/crd/bases:$test_dir/infrastructure/docker/config/crd/bases"
  print_tool CSO_CLUSTERCTL "$CAPI_MANAGER_DIR/clusterctl"
}

# build_capi: the Cluster API managers of the wrapper module hack/testenv/capi, each built when its binary is missing.
# `go install sigs.k8s.io/cluster-api/core@v1.14.x` is refused (the module replaces its api module with ./api); the
# wrapper requires both modules (and the test module, for the Docker/Dev provider) at one version and names the
# main packages in `tool` directives, so `go build PACKAGE` inside it builds upstream's main.go as is.
build_capi() {
  build_capi_binaries core:cluster-api-manager bootstrap/kubeadm:kubeadm-bootstrap-manager \
    controlplane/kubeadm:kubeadm-control-plane-manager test/infrastructure/docker:capd-manager
}

# build_clusterctl: clusterctl of the same wrapper module and release as the managers (its `tool` directive too), for
# `clusterctl move` in the tests; after the managers, whose build cache it shares: 25 s on 2 cores.
build_clusterctl() {
  build_capi_binaries cmd/clusterctl:clusterctl
}

# build_capi_binaries PACKAGE:NAME...: `sigs.k8s.io/cluster-api/PACKAGE` of the wrapper module hack/testenv/capi into
# $CAPI_MANAGER_DIR/NAME, each built when missing, version-stamped as upstream's release builds are
# (hack/scripts/release/version.sh: the managers' and clusterctl's `version` package).
build_capi_binaries() {
  local minor="${CAPI_MANAGER_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w" pair
  for pair in "gitVersion=$CAPI_MANAGER_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean; do
    ld+=" -X sigs.k8s.io/cluster-api/version.$pair"
  done
  local entry pkg target start
  for entry in "$@"; do
    pkg="sigs.k8s.io/cluster-api/${entry%%:*}"
    target="$CAPI_MANAGER_DIR/${entry##*:}"
    if [[ -x "$target" ]]; then say "cluster-api $CAPI_MANAGER_VERSION ${entry##*:}: cached at $target"; continue; fi
    say "cluster-api $CAPI_MANAGER_VERSION ${entry##*:}: building from the Go module proxy (cold: ~4 minutes for the first, under 1 for each other)"
    mkdir -p "$CAPI_MANAGER_DIR"
    start=$SECONDS
    (cd "$ROOT/hack/testenv/capi" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly GONOSUMDB=sigs.k8s.io/cluster-api/test \
      CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$target.tmp" "$pkg")
    mv "$target.tmp" "$target"
    say "cluster-api ${entry##*:}: built in $((SECONDS - start))s"
  done
}

# build_helm VERSION PATH: helm VERSION (v3.x or v4.x) from the Go module proxy into PATH.
build_helm() {
  local version="$1" target="$2"
  local module="helm.sh/helm/${version%%.*}"
  if [[ -x "$target" ]]; then say "helm $version: cached at $target"; return; fi
  say "helm $version: building from the Go module proxy (cold: a few minutes)"
  local start=$SECONDS gobin
  gobin="$(mktemp -d)"
  GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$gobin" go install -trimpath \
    -ldflags "-s -w -X $module/internal/version.version=$version" "$module/cmd/helm@$version"
  mkdir -p "$(dirname "$target")"
  mv "$gobin/helm" "$target"
  rm -rf "$gobin"
  say "helm $version: built in $((SECONDS - start))s"
}

# yaml2json: YAML stream on stdin -> a JSON array, one entry per document, the way kubectl and Helm's kube client
# read manifests: split by apimachinery's YAMLReader, each document converted by sigs.k8s.io/yaml.YAMLToJSON.
build_yaml2json() {
  if [[ -x "$YAML2JSON" ]]; then say "yaml2json: cached at $YAML2JSON"; return; fi
  say "yaml2json: building from the Go module proxy (cold: ~15 s)"
  local start=$SECONDS dir
  dir="$(mktemp -d)"
  cat > "$dir/go.mod" <<'EOF'
module cso.invalid/yaml2json

go 1.25.0

require (
	k8s.io/apimachinery v0.35.4
	sigs.k8s.io/yaml v1.6.0
)

require (
	go.yaml.in/yaml/v2 v2.4.3 // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
)
EOF
  cat > "$dir/go.sum" <<'EOF'
github.com/google/go-cmp v0.7.0 h1:wk8382ETsv4JYUZwIsn6YpYiWiBsYLSJiTsyBybVuN8=
github.com/google/go-cmp v0.7.0/go.mod h1:pXiqmnSA92OHEEa9HXL2W4E7lf9JzCmGVUdgjX3N/iU=
go.yaml.in/yaml/v2 v2.4.3 h1:6gvOSjQoTB3vt1l+CU+tSyi/HOjfOjRLJ4YwYZGwRO0=
go.yaml.in/yaml/v2 v2.4.3/go.mod h1:zSxWcmIDjOzPXpjlTTbAsKokqkDNAVtZO0WOMiT90s8=
go.yaml.in/yaml/v3 v3.0.4 h1:tfq32ie2Jv2UxXFdLJdh3jXuOzWiL1fo0bu/FbuKpbc=
go.yaml.in/yaml/v3 v3.0.4/go.mod h1:DhzuOOF2ATzADvBadXxruRBLzYTpT36CKvDb3+aBEFg=
gopkg.in/check.v1 v0.0.0-20161208181325-20d25e280405 h1:yhCVgyC4o1eVCa2tZl7eS0r+SDo693bJlVdllGtEeKM=
gopkg.in/check.v1 v0.0.0-20161208181325-20d25e280405/go.mod h1:Co6ibVJAznAaIkqp8huTwlJQCZ016jof/cbN4VW5Yz0=
k8s.io/apimachinery v0.35.4 h1:xtdom9RG7e+yDp71uoXoJDWEE2eOiHgeO4GdBzwWpds=
k8s.io/apimachinery v0.35.4/go.mod h1:NNi1taPOpep0jOj+oRha3mBJPqvi0hGdaV8TCqGQ+cc=
sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 h1:IpInykpT6ceI+QxKBbEflcR5EXP7sU1kvOlxwZh5txg=
sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730/go.mod h1:mdzfpAEoE6DHQEN0uh9ZbOCuHbLK5wOm7dK4ctXE9Tg=
sigs.k8s.io/yaml v1.6.0 h1:G8fkbMSAFqgEFgh4b1wmtzDnioxFCUgTZhlbj5P9QYs=
sigs.k8s.io/yaml v1.6.0/go.mod h1:796bPqUfzR/0jLAl6XjHl3Ck7MiyVv8dbTdyT3/pMf4=
EOF
  cat > "$dir/main.go" <<'EOF'
// Prints a JSON array with one entry per document of the YAML stream on stdin (null for empty ones), or the
// first error on stderr with exit code 1.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

func main() {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	out := bufio.NewWriter(os.Stdout)
	out.WriteString("[")
	for n := 0; ; n++ {
		document, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil {
			document, err = yaml.YAMLToJSON(document)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "document %d: %v\n", n+1, err)
			os.Exit(1)
		}
		if n > 0 {
			out.WriteString(",")
		}
		out.Write(document)
	}
	out.WriteString("]\n")
	out.Flush()
}
EOF
  mkdir -p "$(dirname "$YAML2JSON")"
  (cd "$dir" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$YAML2JSON.tmp" .)
  mv "$YAML2JSON.tmp" "$YAML2JSON"
  rm -rf "$dir"
  say "yaml2json: built in $((SECONDS - start))s"
}

# build_renderer: hack/renderer (its own go.mod, modules from the Go module proxy), with the Helm version its go.mod
# requires stamped in as build_helm stamps it, so that `.Capabilities.HelmVersion` reads the same as helm's.
build_renderer() {
  local helm_version
  helm_version="$(awk '$1 == "helm.sh/helm/v3" { print $2 }' "$ROOT/hack/renderer/go.mod")"
  if [[ -x "$RENDERER" ]]; then say "cso-renderer: cached at $RENDERER"; return; fi
  say "cso-renderer: building hack/renderer from the Go module proxy (cold: about a minute)"
  local start=$SECONDS
  mkdir -p "$(dirname "$RENDERER")"
  (cd "$ROOT/hack/renderer" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version" -o "$RENDERER.tmp" .)
  mv "$RENDERER.tmp" "$RENDERER"
  say "cso-renderer: built in $((SECONDS - start))s"
}

# link_renderer: cso-renderer beside the cso that cargo builds (target/debug/ and target/release/), where `cso run`
# looks for it when neither --renderer-binary nor CSO_RENDERER is given, as it finds it beside cso in the image:
# after `make tools`, `cargo build` and `target/debug/cso run ...` render with nothing else to set. A symbolic link
# to the cached binary, pointed at the current build by each `make tools`; `cargo clean` removes it and the
# next `make tools` puts it back.
link_renderer() {
  local target_dir="${CARGO_TARGET_DIR:-$ROOT/target}" profile
  [[ "$target_dir" = /* ]] || target_dir="$ROOT/$target_dir"
  for profile in debug release; do
    mkdir -p "$target_dir/$profile"
    ln -sfn "$RENDERER" "$target_dir/$profile/cso-renderer"
  done
  say "cso-renderer: linked beside cso in $target_dir/debug/ and $target_dir/release/"
}

fetch_capi() {
  say "cluster-api $CAPI_VERSION CRDs: downloading into the Go module cache (if missing)"
  # The checksum database has no entry for the test module of some releases: skip the lookup for it alone.
  GONOSUMDB=sigs.k8s.io/cluster-api/test go mod download "sigs.k8s.io/cluster-api@$CAPI_VERSION" "sigs.k8s.io/cluster-api/test@$CAPI_VERSION"
  say "cert-manager $CERT_MANAGER_VERSION CRDs: downloading into the Go module cache (if missing)"
  go mod download "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION"
}

install_registry() {
  if command -v docker-registry >/dev/null 2>&1; then say "docker-registry: installed"; return; fi
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    say "docker-registry: not installed and cannot apt-get it here; the OCI tests will fail"; return
  fi
  say "docker-registry: installing Debian's package"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null
  # The package starts a system service; the tests run their own registry on loopback instead.
  (systemctl disable --now docker-registry >/dev/null 2>&1 || service docker-registry stop >/dev/null 2>&1 || true)
}

# iptables (Debian's package): the test environment's egress guard (cso_testenv::egress) counts and drops, on the
# machine's uplink, any packet to the simulated clusters' addresses; `ip` (iproute2) and `flock` (util-linux) come
# with the machine.
install_network_tools() {
  if command -v iptables >/dev/null 2>&1 && command -v ip6tables >/dev/null 2>&1; then say "iptables: installed"; return; fi
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    say "iptables: not installed and cannot apt-get it here; the test environment will refuse to start"; return
  fi
  say "iptables: installing Debian's package"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables >/dev/null
}

install_prometheus() {
  if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    say "prometheus, promtool: installed"; return
  fi
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    say "prometheus: not installed and cannot apt-get it here; the observability tests will fail"; return
  fi
  say "prometheus, promtool: installing Debian's package"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package starts a system service; the tests run their own server on loopback instead.
  (systemctl disable --now prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1 || true)
}

# install_for_demo: only what `make demo` runs (`cso-dev demo`: control planes of kube-apiserver and etcd, workloads
# on kwok's simulated nodes through kube-controller-manager and kube-scheduler, Cluster API's four managers, and the
# operator in-process rendering with cso-renderer): not helm 3 and 4, yaml2json, cosign, the registry or the
# Cluster API v1.10 and cert-manager CRDs, which only the tests use (`make tools` and `make test` install them).
# The environment file lists what is built, whatever installed it.
install_for_demo() {
  say "installing what the demo needs (\`make tools\` installs the rest, for the tests)"
  build_renderer
  link_renderer
  install_network_tools
  build_kubernetes
  build_kwok
  build_capi
  MODULES_OFFLINE=1 write_env
  say "ready for the demo: environment in $CACHE/env"
}

case "${1:-install}" in
  --env) print_env ;;
  addon-images) build_addon_images ;;
  # Only clusterctl (on a machine whose tools predate it), then the environment file again.
  clusterctl) build_clusterctl; write_env ;;
  install)
    case "${2:-}" in
      "") ;;
      --for) [[ "${3:-}" == demo ]] || { echo "$0 install --for: only 'demo' is known" >&2; exit 2; }
        install_for_demo; exit 0 ;;
      *) echo "usage: $0 [install [--for demo]|--env|addon-images|clusterctl]" >&2; exit 2 ;;
    esac
    fetch_capi
    build_helm "$HELM_VERSION" "$HELM"
    build_helm "$HELM4_VERSION" "$HELM4"
    build_yaml2json
    build_renderer
    link_renderer
    install_registry
    install_prometheus
    install_network_tools
    build_kubernetes
    build_node_tools
    build_kwok
    build_cosign
    build_capi
    build_clusterctl
    write_env
    say "ready: environment in $CACHE/env"
    ;;
  *) echo "usage: $0 [install [--for demo]|--env|addon-images|clusterctl]" >&2; exit 2 ;;
esac
