#!/usr/bin/env bash
# Builds the binaries of the local control plane (internal/plane) from source
# via the Go module proxy, next to the envtest binaries in
# bin/k8s/<version>-<os>-<arch>/. No prebuilt binaries are downloaded.
#
#   etcd, kube-apiserver, kubectl     hack/setup-envtest.sh (run first)
#   kube-controller-manager,          hack/tools/kube-apiserver: the same module,
#   kube-scheduler                    so the same dependency set and build cache
#                                     as kube-apiserver (mostly a link step)
#   kwok                              hack/tools/kwok, a module of its own
#
# Idempotent: if all binaries already exist, it only prints the directory.
# The last (and on a cache hit, only) line of stdout is the directory; all
# else goes to stderr. It shares hack/setup-envtest.sh's lock, so the two
# scripts never build at once.
set -euo pipefail

K8S_VERSION=1.36.3
K8S_MAJOR=1
K8S_MINOR=36

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
TOOLS="${ROOT}/hack/tools"
BINARIES=(kube-controller-manager kube-scheduler kwok)

GO="${GO:-go}"
if ! command -v "${GO}" >/dev/null 2>&1; then
  if [[ -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
  else
    echo "setup-plane: go not found in PATH" >&2
    exit 1
  fi
fi

# kwok's version is whatever hack/tools/kwok/go.mod pins; a stamp beside the
# binary makes a version bump rebuild it.
KWOK_VERSION="$(awk '$1 == "sigs.k8s.io/kwok" { print $2 }' "${TOOLS}/kwok/go.mod")"
[[ -n "${KWOK_VERSION}" ]] || { echo "setup-plane: no sigs.k8s.io/kwok in hack/tools/kwok/go.mod" >&2; exit 1; }

# The envtest binaries first: the plane runs its etcd and kube-apiserver, and
# building kube-apiserver fills the build cache the two binaries below reuse.
ASSETS="$("${ROOT}/hack/setup-envtest.sh" | tail -n 1)"

have_all() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -f "${ASSETS}/${b}" && -x "${ASSETS}/${b}" ]] || return 1
  done
  [[ "$(cat "${ASSETS}/kwok.version" 2>/dev/null)" == "${KWOK_VERSION}" ]]
}

if have_all; then
  echo "${ASSETS}"
  exit 0
fi

# Serialise with concurrent runs of this script and of setup-envtest.sh;
# re-check once the lock is held.
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

export GOWORK=off
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
export GOOS="$(GOFLAGS= "${GO}" env GOHOSTOS)" GOARCH="$(GOFLAGS= "${GO}" env GOHOSTARCH)"

# The same version stamp as kube-apiserver's, or --version prints a placeholder.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=v${K8S_VERSION}"
  ldflags+=" -X ${pkg}.gitMajor=${K8S_MAJOR}"
  ldflags+=" -X ${pkg}.gitMinor=${K8S_MINOR}"
done

start=${SECONDS}
echo "setup-plane: building kube-controller-manager and kube-scheduler v${K8S_VERSION} into ${ASSETS}" >&2
(cd "${TOOLS}/kube-apiserver" && "${GO}" build -trimpath -ldflags "${ldflags}" -o "${STAGE}/" ./kube-controller-manager ./kube-scheduler) >&2
echo "setup-plane: kube-controller-manager and kube-scheduler built in $((SECONDS - start))s" >&2

kwok_start=${SECONDS}
echo "setup-plane: building kwok ${KWOK_VERSION}" >&2
(cd "${TOOLS}/kwok" && "${GO}" build -trimpath -ldflags "-s -w" -o "${STAGE}/kwok" sigs.k8s.io/kwok/cmd/kwok) >&2
echo "setup-plane: kwok built in $((SECONDS - kwok_start))s" >&2

for b in "${BINARIES[@]}"; do
  [[ -x "${STAGE}/${b}" ]] || { echo "setup-plane: ${b} was not built" >&2; exit 1; }
done
for b in "${BINARIES[@]}"; do
  mv -f "${STAGE}/${b}" "${ASSETS}/${b}"
done
echo "${KWOK_VERSION}" >"${ASSETS}/kwok.version"

echo "setup-plane: done in $((SECONDS - start))s" >&2
echo "${ASSETS}"
