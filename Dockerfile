# The manager image, for `make docker-build` (docker or podman). `make image`
# builds the same image without docker (hack/tools/image);
# test/install/image_test.go checks that the two agree.
#
# The bases are pinned by digest, so a build is of known bits whatever the
# tags point to now; a new digest is a reviewed change of this file. The
# builder runs on the build machine's platform (BUILDPLATFORM) and
# cross-compiles for the image's (TARGETOS/TARGETARCH): the manager is pure
# Go, so `docker buildx build --platform linux/amd64,linux/arm64` needs no
# emulation.
# golang:1.26 (Go 1.26.5), the multi-arch index's digest as docker-library
# publishes it (repo-info, repos/golang/remote/1.26.md).
FROM --platform=$BUILDPLATFORM golang:1.26@sha256:3aff6657219a4d9c14e27fb1d8976c49c29fddb70ba835014f477e1c70636647 AS builder
ARG TARGETOS
ARG TARGETARCH
# What `manager --version` prints; make docker-build passes VERSION.
ARG VERSION=dev

WORKDIR /workspace
# The dependencies first, so that they stay cached while the sources change.
COPY go.mod go.sum ./
RUN go mod download

COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY pkg/ pkg/

# Static (CGO_ENABLED=0) and stripped (-s -w), as `make manager` builds it:
# distroless/static has no libc. GOARCH is left to the platform docker
# builds for (TARGETARCH), whatever platform the builder runs on.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o manager ./cmd/manager

# distroless/static: CA certificates, time zones and a nonroot user, no shell.
# The multi-arch index's digest of the nonroot tag (the one Debian 12's
# static-debian12:nonroot has).
FROM gcr.io/distroless/static:nonroot@sha256:e8a4044e0b4ae4257efa45fc026c0bc30ad320d43bd4c1a7d5271bd241e386d0
ARG VERSION=dev
# The commit built; make docker-build passes REVISION.
ARG REVISION=unknown
LABEL org.opencontainers.image.title="lockwarden-manager" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/lockwarden/lockwarden" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /
COPY --from=builder /workspace/manager .
USER 65532:65532

ENTRYPOINT ["/manager"]
