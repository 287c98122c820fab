#!/usr/bin/env bash
# Builds a local control plane of the oldest Kubernetes lockwarden supports
# (1.30) from source via the Go module proxy, into
# bin/k8s/<version>-<os>-<arch>/, for `make test-k8s-oldest`. No prebuilt
# binaries are downloaded.
#
#   kube-apiserver, kube-controller-manager,   hack/tools/kube-1.30 (k8s.io/kubernetes
#   kube-scheduler                             v1.30.14, its staging modules at v0.30.14)
#   etcd, kubectl, kwok                        the 1.36 plane's (hack/setup-plane.sh):
#                                              etcd's API and kwok serve any version;
#                                              kubectl is the client the tests use
#
# Idempotent: if all binaries already exist, it only prints the directory.
# The last (and on a cache hit, only) line of stdout is the directory; all
# else goes to stderr. It takes hack/setup-envtest.sh's lock. A cold build
# takes as long as the 1.36 plane's first one (a quarter of an hour or more
# on two cores): nothing of 1.36's build cache is shared.
set -euo pipefail

K8S_VERSION=1.30.14
K8S_MAJOR=1
K8S_MINOR=30

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
TOOLS="${ROOT}/hack/tools/kube-1.30"
BUILT=(kube-apiserver kube-controller-manager kube-scheduler)
SHARED=(etcd kubectl kwok)

GO="${GO:-go}"
command -v "${GO}" >/dev/null 2>&1 || GO=/usr/local/go/bin/go

# The 1.36 plane first, for etcd, kubectl and kwok.
PLANE="$("${ROOT}/hack/setup-plane.sh" | tail -n 1)"
HOST_OS="$(GOFLAGS= "${GO}" env GOHOSTOS)"
HOST_ARCH="$(GOFLAGS= "${GO}" env GOHOSTARCH)"
ASSETS="${ROOT}/bin/k8s/${K8S_VERSION}-${HOST_OS}-${HOST_ARCH}"

have_all() {
  local b
  for b in "${BUILT[@]}" "${SHARED[@]}"; do
    [[ -x "${ASSETS}/${b}" ]] || return 1
  done
}

if have_all; then
  echo "${ASSETS}"
  exit 0
fi

mkdir -p "${ROOT}/bin/k8s"
if command -v flock >/dev/null 2>&1; then
  exec 9>"${ROOT}/bin/k8s/.setup-envtest.lock"
  flock 9
  if have_all; then
    echo "${ASSETS}"
    exit 0
  fi
fi

STAGE="$(mktemp -d "${ROOT}/bin/k8s/.build.XXXXXX")"
trap 'rm -rf "${STAGE}"' EXIT

export GOWORK=off
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
export GOOS="${HOST_OS}" GOARCH="${HOST_ARCH}"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=v${K8S_VERSION}"
  ldflags+=" -X ${pkg}.gitMajor=${K8S_MAJOR}"
  ldflags+=" -X ${pkg}.gitMinor=${K8S_MINOR}"
done

start=${SECONDS}
echo "setup-k8s-oldest: building kube-apiserver, kube-controller-manager and kube-scheduler v${K8S_VERSION} into ${ASSETS}" >&2
(cd "${TOOLS}" && "${GO}" build -trimpath -ldflags "${ldflags}" -o "${STAGE}/" ./kube-apiserver ./kube-controller-manager ./kube-scheduler) >&2
for b in "${BUILT[@]}"; do
  [[ -x "${STAGE}/${b}" ]] || { echo "setup-k8s-oldest: ${b} was not built" >&2; exit 1; }
done
for b in "${SHARED[@]}"; do
  cp "${PLANE}/${b}" "${STAGE}/${b}"
done
mkdir -p "${ASSETS}"
for b in "${BUILT[@]}" "${SHARED[@]}"; do
  mv -f "${STAGE}/${b}" "${ASSETS}/${b}"
done
echo "setup-k8s-oldest: done in $((SECONDS - start))s" >&2
echo "${ASSETS}"
