#!/usr/bin/env bash
# Builds the envtest control-plane binaries (etcd, kube-apiserver, kubectl)
# from source via the Go module proxy and caches them under
# bin/k8s/<version>-<os>-<arch>/. No prebuilt binaries are downloaded.
#
# The binaries come from two small modules, separate from the main module:
#   hack/tools/etcd            -> go.etcd.io/etcd/server/v3/etcdmain.Main
#   hack/tools/kube-apiserver  -> k8s.io/kubernetes/cmd/kube-apiserver/app
#                                 (and ./kubectl -> k8s.io/kubectl/pkg/cmd)
#
# Idempotent: if all binaries already exist, it only prints the directory.
# The last (and on a cache hit, only) line of stdout is the assets directory,
# suitable for KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh). Everything else
# goes to stderr. The first build takes several minutes.
set -euo pipefail

K8S_VERSION=1.36.3
K8S_MAJOR=1
K8S_MINOR=36

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
TOOLS="${ROOT}/hack/tools"
BINARIES=(etcd kube-apiserver kubectl)

GO="${GO:-go}"
if ! command -v "${GO}" >/dev/null 2>&1; then
  if [[ -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
  else
    echo "setup-envtest: go not found in PATH" >&2
    exit 1
  fi
fi

# Build for the host: these binaries are run by envtest on this machine.
HOST_OS="$(GOFLAGS= "${GO}" env GOHOSTOS)"
HOST_ARCH="$(GOFLAGS= "${GO}" env GOHOSTARCH)"
ASSETS="${ROOT}/bin/k8s/${K8S_VERSION}-${HOST_OS}-${HOST_ARCH}"

have_all() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -f "${ASSETS}/${b}" && -x "${ASSETS}/${b}" ]] || return 1
  done
}

if have_all; then
  echo "${ASSETS}"
  exit 0
fi

mkdir -p "${ROOT}/bin/k8s"

# Serialise concurrent runs (e.g. make -j); re-check once the lock is held.
if command -v flock >/dev/null 2>&1; then
  exec 9>"${ROOT}/bin/k8s/.setup-envtest.lock"
  flock 9
  if have_all; then
    echo "${ASSETS}"
    exit 0
  fi
fi

# Build into a scratch directory and move into place only on success, so an
# interrupted build never leaves a half-populated cache behind.
STAGE="$(mktemp -d "${ROOT}/bin/k8s/.build.XXXXXX")"
trap 'rm -rf "${STAGE}"' EXIT

export GOWORK=off                          # never pick up a go.work
export GOFLAGS="-mod=readonly -buildvcs=false" # go.mod/go.sum are committed
export CGO_ENABLED=0
export GOOS="${HOST_OS}" GOARCH="${HOST_ARCH}"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=v${K8S_VERSION}"
  ldflags+=" -X ${pkg}.gitMajor=${K8S_MAJOR}"
  ldflags+=" -X ${pkg}.gitMinor=${K8S_MINOR}"
done

start=${SECONDS}
echo "setup-envtest: building envtest binaries for Kubernetes v${K8S_VERSION} into ${ASSETS} (first build takes several minutes)" >&2

echo "setup-envtest: building etcd" >&2
(cd "${TOOLS}/etcd" && "${GO}" build -trimpath -ldflags "-s -w" -o "${STAGE}/etcd" .) >&2

echo "setup-envtest: building kube-apiserver and kubectl" >&2
(cd "${TOOLS}/kube-apiserver" && "${GO}" build -trimpath -ldflags "${ldflags}" -o "${STAGE}/" . ./kubectl) >&2

for b in "${BINARIES[@]}"; do
  [[ -x "${STAGE}/${b}" ]] || { echo "setup-envtest: ${b} was not built" >&2; exit 1; }
done

mkdir -p "${ASSETS}"
for b in "${BINARIES[@]}"; do
  mv -f "${STAGE}/${b}" "${ASSETS}/${b}"
done

echo "setup-envtest: done in $((SECONDS - start))s" >&2
echo "${ASSETS}"
