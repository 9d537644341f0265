#!/usr/bin/env bash
# The operator pod's memory as the kernel accounts it (its memory cgroup), at N = 0 and N Clusters: `cso-dev up
# --real-nodes` (a real node, Cluster API, the chart's defaults but the release source), a ClusterStack of the
# bundled ferrol v1, then N Clusters of its class built by Cluster API (the stand-in points them all at one
# workload control plane: a benchmark convenience, see docs/benchmarks.md), until every ClusterAddon is ready.
# Usage: hack/bench/in-cluster-memory.sh [N] (default 100). Needs root, `make tools`, `make image-test`, kubectl
# and bc.
set -euo pipefail
N="${1:-100}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="$(mktemp -d /tmp/cso-bench-in-cluster-XXXX)"
(cd "$ROOT" && cargo build -q -p cso-dev)
"$ROOT/target/debug/cso-dev" up --real-nodes --dir "$DIR/up" > "$DIR/up.out" 2> "$DIR/up.err" &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 120); do grep -q '^ready' "$DIR/up.out" && break; sleep 1; done
grep -q '^ready' "$DIR/up.out" || { cat "$DIR/up.err"; exit 1; }
SLOT="$(sed -n 's/.*slot \([0-9]*\),.*/\1/p' "$DIR/up.out")"
export KUBECONFIG="$DIR/up/management.kubeconfig"

# memory LABEL: working set (usage less inactive file) and resident set of the operator's pod, from its cgroup.
memory() {
  local uid cg usage inactive rss=0 pid
  uid="$(kubectl get pods -n cso-system -l app.kubernetes.io/component=controller-manager -o jsonpath='{.items[0].metadata.uid}')"
  cg="$(find "/sys/fs/cgroup/memory/cso-$SLOT-0" -maxdepth 3 -type d -name "pod$uid" | head -1)"
  usage="$(cat "$cg/memory.usage_in_bytes")"
  inactive="$(awk '$1 == "total_inactive_file" {print $2}' "$cg/memory.stat")"
  for pid in $(find "$cg" -name cgroup.procs -exec cat {} +); do
    # A process that ended meanwhile counts nothing.
    rss=$((rss + $(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)))
  done
  printf '%s: working set %.1f MiB, resident %.1f MiB (cso and its renderer)\n' "$1" \
    "$(echo "($usage - $inactive) / 1048576" | bc -l)" "$(echo "$rss / 1024" | bc -l)"
}

sleep 20
memory "N=0 (idle, 20 s after the pod started)"
kubectl create namespace bench >/dev/null
cat <<YAML | kubectl apply -f - >/dev/null
apiVersion: clusterstack.x-k8s.io/v1alpha1
kind: ClusterStack
metadata: {name: ferrol, namespace: bench}
spec: {provider: docker, name: ferrol, kubernetesVersion: "1.27", channel: stable, autoSubscribe: false,
       noProvider: true, versions: [v1]}
YAML
for _ in $(seq 1 300); do kubectl get clusterclass -n bench docker-ferrol-1-27-v1 >/dev/null 2>&1 && break; sleep 1; done
kubectl get clusterclass -n bench docker-ferrol-1-27-v1 >/dev/null
START=$SECONDS
for i in $(seq 1 "$N"); do
  cat <<YAML
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: c$i, namespace: bench}
spec:
  clusterNetwork: {services: {cidrBlocks: [10.0.0.0/24]}, pods: {cidrBlocks: [10.244.0.0/16]}, serviceDomain: cluster.local}
  topology:
    classRef: {name: docker-ferrol-1-27-v1}
    version: v1.27.3
    controlPlane: {replicas: 1}
    workers: {machineDeployments: [{class: workeramd64, name: md-0, replicas: 0}]}
    variables: [{name: imageRepository, value: registry.k8s.io}]
---
YAML
done | kubectl apply -f - >/dev/null
until [[ "$(kubectl get clusteraddons -n bench -o jsonpath='{range .items[?(@.status.ready==true)]}x{end}' | wc -c)" -ge "$N" ]]; do
  sleep 2
  if (( SECONDS - START > 1200 )); then echo "not every ClusterAddon ready after 20 minutes" >&2; exit 1; fi
done
echo "N=$N: every ClusterAddon ready $((SECONDS - START)) s after the Clusters were applied"
sleep 20
memory "N=$N (20 s after the last ClusterAddon was ready)"
