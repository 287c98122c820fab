# The manager image, for `make docker-build` (docker or podman). `make image`
# builds the same image without docker (hack/tools/image);
# test/install/image_test.go checks that the two agree.
FROM golang:1.26 AS builder
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
# builds for (TARGETARCH).
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o manager ./cmd/manager

# distroless/static: CA certificates, time zones and a nonroot user, no shell.
FROM gcr.io/distroless/static:nonroot
ARG VERSION=dev
# The commit built; make docker-build passes REVISION.
ARG REVISION=unknown
LABEL org.opencontainers.image.title="lockwarden-manager" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/lockwarden/lockwarden" \
      org.opencontainers.image.revision="${REVISION}"
WORKDIR /
COPY --from=builder /workspace/manager .
USER 65532:65532

ENTRYPOINT ["/manager"]
