# Two commands do all set-up on a fresh machine: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
CARGO ?= cargo
CRD_FILE := config/crd/clusterstack.x-k8s.io.yaml
CHART_CRD_FILE := charts/cluster-stack-operator/templates/crds.yaml
DEMO_DIR ?= $(CURDIR)/target/demo

.PHONY: tools demo-tools build test fmt-check clippy crds crds-check unit demo image-test

## tools: build or fetch everything the tests need: kube-apiserver, kube-controller-manager, kube-scheduler, kwok, helm 3 and 4, cso-renderer, yaml2json, cosign, Cluster API and the registry (cached; cold: ~18 minutes on 2 cores)
tools:
	@bash hack/tools.sh install

## demo-tools: only what `make demo` runs: kube-apiserver, kube-controller-manager, kube-scheduler, kwok, Cluster API's managers and cso-renderer (cached; cold: ~12.5 minutes on 2 cores)
demo-tools:
	@bash hack/tools.sh install --for demo

build:
	$(CARGO) build --workspace --all-targets

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## crds: regenerate the committed CRD YAML (config/ and the Helm chart's template) from the Rust types
crds:
	$(CARGO) run --quiet -p cso -- crds > $(CRD_FILE)
	bash hack/chart-crds.sh < $(CRD_FILE) > $(CHART_CRD_FILE)

## crds-check: fail when the committed CRD YAML differs from what the types produce
crds-check:
	@$(CARGO) run --quiet -p cso -- crds | diff -u $(CRD_FILE) - \
	  || { echo "$(CRD_FILE) is stale: run 'make crds' and commit it" >&2; exit 1; }
	@$(CARGO) run --quiet -p cso -- crds | bash hack/chart-crds.sh | diff -u $(CHART_CRD_FILE) - \
	  || { echo "$(CHART_CRD_FILE) is stale: run 'make crds' and commit it" >&2; exit 1; }

# The tests that run helm, run again with Helm 4. (`--workspace` with `--test` filters: selecting packages
# instead would resolve features differently and rebuild the dependencies.)
HELM4_TESTS := --test values_and_charts --test engine --test workload_and_cel --test management_flow \
  --test workload_flow --test render --test engine_parity

## image-test: the operator's image (hack/image.sh's file system, a faster build profile) as an OCI archive in
## target/image/cso-image.tar, for the tests that run it on a real node (crates/cso/tests/in_cluster.rs)
image-test:
	CSO_IMAGE_PROFILE=image-test bash hack/image.sh

## test: everything CI checks: formatting, clippy, the CRD check and all tests (real API servers, real nodes and
## the image in a cluster), then the tests that run helm again with Helm 4
test: tools fmt-check clippy crds-check image-test
	$(CARGO) test --workspace --no-fail-fast
	CSO_HELM="$$(sed -n 's/^CSO_HELM4=//p' "$${CSO_TOOLS_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/cso}/env")" \
	  $(CARGO) test --workspace --no-fail-fast $(HELM4_TESTS)

## demo: the quick start: install what the demo needs and is missing (demo-tools), then the operator on the bundled stack with a management and a workload control plane; a summary; clean-up
demo: demo-tools
	@bash hack/demo.sh "$(DEMO_DIR)"
