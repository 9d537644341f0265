# syntax=docker/dockerfile:1
# The operator image: a static `cso` (musl), a static `helm` and `cso-renderer` (hack/renderer), CA certificates, nothing else (no shell, no
# package manager), running as 65532 like the Go operator's image. Build: `docker build -t cso .`
# `hack/image.sh` assembles the same file system without a Docker daemon and reports its size.

ARG RUST_VERSION=1.95
ARG GO_VERSION=1.26
ARG HELM_VERSION=v3.20.2

FROM golang:${GO_VERSION}-bookworm AS helm
ARG HELM_VERSION
RUN CGO_ENABLED=0 GOBIN=/out go install -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
      "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"

# The long-lived renderer on Helm's engine (cso_render::Engine), stamped with the Helm version its go.mod requires.
FROM golang:${GO_VERSION}-bookworm AS renderer
WORKDIR /renderer
COPY hack/renderer/ ./
RUN version="$(awk '$1 == "helm.sh/helm/v3" { print $2 }' go.mod)" \
 && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${version}" -o /out/cso-renderer .

FROM rust:${RUST_VERSION}-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry --mount=type=cache,target=/src/target \
    cargo build --locked --profile image -p cso --target x86_64-unknown-linux-musl \
 && cp target/x86_64-unknown-linux-musl/image/cso /cso

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /cso /usr/local/bin/cso
COPY --from=helm /out/helm /usr/local/bin/helm
COPY --from=renderer /out/cso-renderer /usr/local/bin/cso-renderer
# MIMALLOC_PURGE_DELAY: cso's allocator gives freed memory back at once (crates/cso/src/main.rs).
ENV PATH=/usr/local/bin HOME=/tmp SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt MIMALLOC_PURGE_DELAY=0
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cso"]
CMD ["run"]
