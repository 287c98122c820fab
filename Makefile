# lockwarden: reentrant distributed locks on Redis for Kubernetes workloads.
# `make help` lists the targets.

# Tools are built from source with the Go module proxy and kept in bin/.
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
KUSTOMIZE ?= $(LOCALBIN)/kustomize
CONTROLLER_TOOLS_VERSION ?= v0.21.0
KUSTOMIZE_VERSION ?= v5.8.1
HELM ?= $(LOCALBIN)/helm
HELM_VERSION ?= v3.21.4
CRD_REF_DOCS ?= $(LOCALBIN)/crd-ref-docs
CRD_REF_DOCS_VERSION ?= v0.3.0
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
GOLANGCI_LINT_VERSION ?= v2.15.0
ACTIONLINT ?= $(LOCALBIN)/actionlint
ACTIONLINT_VERSION ?= v1.7.12

export GOWORK = off
GO ?= go
GOTEST_FLAGS ?= -race -count=1 -timeout 40m
# The version `manager --version` prints, stamped in by `make manager`.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
MANAGER_BIN ?= $(LOCALBIN)/manager
# The manager image: `make image` builds it here, `make docker-build` with
# docker; deploy and build-installer point the Deployment at it.
IMG ?= $(IMAGE_REPO):$(VERSION)
# Where releases go (`make publish REGISTRY=...` pushes there): the manager
# image's repository is the chart's and config/manager's default.
REGISTRY ?= ghcr.io/lockwarden
IMAGE_REPO ?= $(REGISTRY)/manager
CLI_IMAGE_REPO ?= $(REGISTRY)/lockwarden-cli
CONTAINER_TOOL ?= docker
# Your kubectl and kubeconfig: install, deploy and their reverses act on the
# cluster of its current context.
KUBECTL ?= kubectl
# The image's source and revision labels.
SOURCE_URL ?= https://github.com/lockwarden/lockwarden
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
IMAGE_BIN ?= $(LOCALBIN)/linux-$(IMAGE_ARCH)/manager
IMAGE_OCI ?= dist/image
IMAGE_TAR ?= dist/image.tar
INSTALLER ?= dist/install.yaml
# What deploy, undeploy and build-installer apply: config/default, or
# config/trial-redis to try lockwarden out with a Redis of its own.
DEPLOY_CONFIG ?= config/default
SOAK_ACQUISITIONS ?= 1000000
# make history and make soak: how long the history checker records and
# checks histories on a standalone Redis (TestHistory; make test: 75s) and on
# a Cluster whose masters fail over (TestHistoryCluster; make test: 20s), and
# the seed to start from (empty: a new one, printed).
HISTORY_DURATION ?= 30m
HISTORY_CLUSTER_DURATION ?= 10m
HISTORY_SEED ?=
# make fault: how long the plane's random fault run injects faults, and the
# seed to replay (empty: a new one, printed).
FAULT_DURATION ?= 20m
FAULT_SEED ?=
# MODEL_DEPTH is how many steps make model-check explores every interleaving of.
MODEL_DEPTH ?= 12

.DEFAULT_GOAL := help
SHELL := /usr/bin/env bash -o pipefail

##@ General

.PHONY: help
help: ## Show this list of targets.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: demo
demo: test-deps ## Play the lockwarden story on a local control plane, Redis and manager (no cluster needed).
	$(GO) run ./cmd/demo

.PHONY: manifests
manifests: controller-gen ## Generate the CRD and RBAC manifests under config/ from kubebuilder markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/...;./controllers/..." output:crd:artifacts:config=config/crd/bases
	@# The Helm chart installs the same generated CRD and manager role, and
	@# the same admission policies.
	cp config/crd/bases/locks.lockwarden.dev_distributedlocks.yaml dist/chart/files/crds/
	cp config/rbac/role.yaml dist/chart/files/rbac/manager-role.yaml
	cp config/admission/fencing.yaml config/admission/gate.yaml config/admission/manager.yaml dist/chart/files/admission/
	@# And config/'s opt-in alerts and dashboard.
	cp config/alerts/prometheusrule.yaml config/grafana/lockwarden.json dist/chart/files/monitoring/

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods for the API types.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: api-docs
api-docs: crd-ref-docs ## Write docs/api-reference.md from api/v1alpha1's types and comments (make test fails when it is out of date).
	$(CRD_REF_DOCS) --source-path=api/v1alpha1 --config=hack/api-docs/config.yaml --renderer=markdown --output-path=docs/api-reference.md --log-level=WARN

.PHONY: fmt
fmt: ## Run gofmt on the code.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet on the main module, the benchmark module and the release tools.
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	cd hack/tools/image && $(GO) vet ./...
	cd hack/tools/release && $(GO) vet ./...
	cd hack/tools/promql && $(GO) vet ./...

# golangci-lint with .golangci.yml on the main module; CI's lint workflow
# runs it, with actionlint and helm-lint.
.PHONY: lint
lint: golangci-lint ## Run golangci-lint (.golangci.yml) on the main module.
	$(GOLANGCI_LINT) run ./...

.PHONY: actionlint
actionlint: $(ACTIONLINT) ## Check the GitHub workflows in .github/workflows with actionlint.
	$(ACTIONLINT) -color=false

.PHONY: test
test: test-deps manifests generate vet ## Run every test, with the race detector, against real redis-server, envtest and the local control plane.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed on:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test $(GOTEST_FLAGS) ./...

# A second Kubernetes minor version, the oldest supported, in a target of its
# own: its control plane builds from source on first use (a quarter of an
# hour or more on two cores), which make test should not wait for. There
# the chart picks its gating policy from the cluster, and kustomize installs
# config/without-gating-policy.
.PHONY: test-k8s-oldest
test-k8s-oldest: test-deps ## Run the install tests (make's install targets, the chart installed, upgraded and uninstalled, the documentation's command blocks) on a local plane of Kubernetes 1.30, the oldest supported; make test runs them on 1.36.
	KUBEBUILDER_ASSETS="$$(hack/setup-k8s-oldest.sh)" DEPLOY_CONFIG=config/without-gating-policy LOCKWARDEN_EXPECT_KUBERNETES=1.30 \
	  $(GO) test -count=1 -timeout 40m -v ./test/install/

.PHONY: soak
soak: test-deps ## Run the fault soak longer than `make test` does: SOAK_ACQUISITIONS (default 1,000,000) under random faults, then the history checker (make history).
	LOCKWARDEN_SOAK_ACQUISITIONS=$(SOAK_ACQUISITIONS) $(GO) test -race -count=1 -timeout 12h -run '^TestSoak$$' -v ./pkg/redislock/
	$(MAKE) --no-print-directory history

.PHONY: history
history: redis ## Run the history checker (lock histories under a seeded nemesis, checked with porcupine) for HISTORY_DURATION (default 30m) on standalone Redis and HISTORY_CLUSTER_DURATION (10m) on a failing-over Cluster, instead of make test's 75s and 20s; HISTORY_SEED replays from a seed it printed.
	LOCKWARDEN_HISTORY_DURATION=$(HISTORY_DURATION) LOCKWARDEN_HISTORY_CLUSTER_DURATION=$(HISTORY_CLUSTER_DURATION) LOCKWARDEN_HISTORY_SEED=$(HISTORY_SEED) \
	  $(GO) test -race -count=1 -timeout 12h -run '^TestHistory(Cluster)?$$' -v ./pkg/redislock/

.PHONY: model-check
model-check: ## Explore every interleaving of the model check's world (controllers/decide TestModelCheck: two manager replicas with lagging caches and restarts, a kubelet, Redis losing the key or its counter, selector edits, an un-shared key) to MODEL_DEPTH steps (default 12: 2.4 million states, 2.6 GB, some 80 s a core) instead of make test's 11; the tests from a prepared state go as many steps deeper (from 8 from a lock not yet cached, 7 from B's running grant).
	LOCKWARDEN_MODELCHECK_DEPTH=$(MODEL_DEPTH) $(GO) test -count=1 -timeout 6h -run '^TestModelCheck' -v ./controllers/decide/

.PHONY: fault
fault: test-deps ## Run the random fault run on the local control plane (test/e2e TestFaultRun: two manager replicas, leader kills and pauses, Redis and API server faults) for FAULT_DURATION (default 20m) instead of make test's 2m; FAULT_SEED replays a run's choices.
	LOCKWARDEN_FAULT_DURATION=$(FAULT_DURATION) LOCKWARDEN_FAULT_SEED=$(FAULT_SEED) KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test -race -count=1 -timeout 4h -run '^TestFaultRun$$' -v ./test/e2e/

# The last line runs the manager binary at issue 15's scale: 10,000 locks and
# 130,000 pods take 15-20 minutes on two cores, most of it creating the pods.
# Smaller: LOCKWARDEN_SCALE_LOCKS=1000 LOCKWARDEN_SCALE_PODS=10000 make bench.
.PHONY: bench
# -p 1: one package's benchmark at a time, so that none shares the two
# cores with another's control plane.
bench: test-deps ## Print the benchmark tables: the library against redsync and bsm/redislock, the watchdog at 1k-100k locks, the controller at 200 locks and the manager binary at 10,000 locks and 130,000 pods (test/scale), failover against client-go's election, and the hand-over on the local control plane.
	cd bench && $(GO) run ./cmd/lockbench $(BENCH_FLAGS)
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test -p 1 -count=1 -run '^$$' -bench . -benchtime 1x ./controllers/ ./internal/failover/ ./test/e2e/
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 90m ./test/scale/

##@ Build

.PHONY: build
build: generate manager ## Build the library, and the static manager binary into bin/.
	$(GO) build ./...

# CGO_ENABLED=0: with cgo the net and os/user packages link libc
# dynamically, and the binary would not run in a scratch or distroless
# image, or on a libc other than the builder's. -s -w: no symbol table and
# no DWARF (87 MB to 61 MB); panics still print their stack traces.
# -buildvcs=false: the version is VERSION, and the binary does not change
# with the state of the git work tree.
MANAGER_LDFLAGS ?= -s -w
.PHONY: manager
manager: ## Build only the static manager binary into MANAGER_BIN (default bin/manager), stripped and stamped with VERSION.
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "$(MANAGER_LDFLAGS) -X main.version=$(VERSION)" -o $(MANAGER_BIN) ./cmd/manager

# The CLI, built as the manager is (static, stripped, stamped with VERSION),
# under both its names: kubectl runs kubectl-lockwarden for `kubectl
# lockwarden`, and the binary names itself after the name it was run by.
CLI_DIR ?= $(LOCALBIN)
.PHONY: cli
cli: ## Build the CLI into CLI_DIR (default bin/) as lockwarden and kubectl-lockwarden (the kubectl plugin), static, stripped and stamped with VERSION.
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "$(MANAGER_LDFLAGS) -X main.version=$(VERSION)" -o $(CLI_DIR)/lockwarden ./cmd/lockwarden
	cp $(CLI_DIR)/lockwarden $(CLI_DIR)/kubectl-lockwarden

# GOOS=linux: the image runs on Linux whatever the host. The builder
# refuses a binary that is not static and linux.
.PHONY: image
image: ## Build the manager image IMG with no docker daemon and no network (no base image): an OCI layout in IMAGE_OCI (dist/image) and a tarball for `docker load` in IMAGE_TAR (dist/image.tar).
	GOOS=linux GOARCH=$(IMAGE_ARCH) $(MAKE) --no-print-directory manager MANAGER_BIN=$(IMAGE_BIN) VERSION=$(VERSION)
	mkdir -p $(dir $(IMAGE_OCI)) $(dir $(IMAGE_TAR))
	cd hack/tools/image && $(GO) run . -binary $(abspath $(IMAGE_BIN)) -version $(VERSION) -source $(SOURCE_URL) -revision $(REVISION) -tag $(IMG) -oci $(abspath $(IMAGE_OCI)) -tar $(abspath $(IMAGE_TAR))

.PHONY: docker-build
docker-build: ## Build the manager image IMG from the Dockerfile with docker (or CONTAINER_TOOL=podman).
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the manager image IMG with docker (or CONTAINER_TOOL=podman).
	$(CONTAINER_TOOL) push $(IMG)

##@ Deployment

ignore-not-found ?= false

# DEPLOY_CONFIG with the manager's image set to IMG, as kubebuilder's
# `kustomize edit set image` does, but on a copy of config/, so no tracked
# file changes.
define kustomize-deploy
( tmp="$$(mktemp -d)" && trap 'rm -rf "$$tmp"' EXIT && cp -R config "$$tmp/" && \
  cd "$$tmp/config/manager" && $(KUSTOMIZE) edit set image controller=$(IMG) && \
  $(KUSTOMIZE) build "$$tmp/$(DEPLOY_CONFIG)" )
endef

.PHONY: install
install: manifests kustomize ## Install the DistributedLock CRD into the cluster of KUBECTL's current context.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) apply -f -

.PHONY: uninstall
uninstall: manifests kustomize ## Remove the CRD and every DistributedLock (a manager must be running to release them); ignore-not-found=true to ignore what is gone.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -

.PHONY: deploy
deploy: manifests kustomize ## Install the CRD, RBAC and the manager running IMG (DEPLOY_CONFIG, default config/default; config/trial-redis adds a Redis to try it with) into the cluster of KUBECTL's current context.
	$(kustomize-deploy) | $(KUBECTL) apply -f -

.PHONY: undeploy
undeploy: kustomize ## Remove what deploy installed, the CRD and its DistributedLocks included; ignore-not-found=true to ignore what is gone.
	$(KUSTOMIZE) build $(DEPLOY_CONFIG) | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -

.PHONY: build-installer
build-installer: manifests generate kustomize ## Write what deploy installs, with the manager running IMG, as one file INSTALLER (dist/install.yaml) for `kubectl apply -f`.
	mkdir -p $(dir $(INSTALLER))
	$(kustomize-deploy) >$(INSTALLER).tmp
	mv $(INSTALLER).tmp $(INSTALLER)

##@ Release

# One version, every artifact: `make release VERSION=v0.2.0` writes
# RELEASE_DIR (dist/release/v0.2.0/):
#   manager-linux-{amd64,arm64}           the stripped static binaries, stamped with VERSION
#   manager-linux-{amd64,arm64}.cdx.json  their SBOMs, CycloneDX, from the Go modules built in
#   image/, manager-image.oci.tar         the multi-arch OCI image index (and the layout as a tar),
#                                         labelled with VERSION, SOURCE_URL and REVISION
#   image-digest                          the index's digest
#   kubectl-lockwarden_OS_ARCH.tar.gz     the CLI for CLI_PLATFORMS, stamped with VERSION, as
#                                         kubectl-lockwarden (and LICENSE), for krew or by hand
#   lockwarden.yaml                       the krew manifest: the archives at RELEASE_URL, their SHA-256
#   cli-image/, cli-image-digest          the CLI's multi-arch image (/lockwarden, as the manager's
#                                         image holds /manager), an OCI layout, and its digest
#   install.yaml                          config/default with the image by tag and digest
#   lockwarden-X.Y.Z.tgz                  the chart, appVersion VERSION, image IMAGE_REPO, its digest pinned
#   release-notes.md                      CHANGELOG's section for VERSION
#   SHA256SUMS                            of all the files above (not the layouts' directories)
# Every timestamp is the commit's (SOURCE_DATE_EPOCH), so the same commit,
# Go and VERSION give the same bytes: test/release builds it twice and
# compares. `make publish` builds it and pushes it to REGISTRY.
RELEASE_DIR ?= dist/release/$(VERSION)
RELEASE_ARCHS ?= amd64 arm64
CLI_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
# Where the krew manifest says the CLI archives are downloaded from: the
# GitHub release the maintainer makes for the tag (docs/releasing.md).
RELEASE_URL ?= $(SOURCE_URL)/releases/download/$(VERSION)
CHANGELOG ?= CHANGELOG.md
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
CYCLONEDX_GOMOD ?= $(LOCALBIN)/cyclonedx-gomod
CYCLONEDX_GOMOD_VERSION ?= v1.10.0
# A release is of a commit: RELEASE_ALLOW_DIRTY=1 builds one from a work
# tree with changes (its revision label then ends in -dirty).
RELEASE_ALLOW_DIRTY ?=
# The CLI's build, as the manager's (see MANAGER_LDFLAGS): static, stripped,
# `lockwarden version` printing VERSION.
CLI_LDFLAGS ?= -s -w -X main.version=$(VERSION)

.PHONY: release
release: manifests kustomize helm cyclonedx-gomod ## Build every artifact of release VERSION (vX.Y.Z) into RELEASE_DIR: binaries, SBOMs, the multi-arch images, install.yaml, the chart, the CLI's archives and krew manifest, checksums.
	@[[ "$(VERSION)" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$ ]] || { echo "make release: VERSION=$(VERSION) is not vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2; exit 1; }
	@[[ -n "$(RELEASE_ALLOW_DIRTY)" ]] || git diff --quiet HEAD || { echo "make release: the work tree has changes; commit them, or set RELEASE_ALLOW_DIRTY=1" >&2; exit 1; }
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	@# The binaries, and each one's SBOM from the modules it was built from
	@# (offline: no license or version is looked up on the network).
	set -e; for arch in $(RELEASE_ARCHS); do \
	  GOOS=linux GOARCH=$$arch $(MAKE) --no-print-directory manager MANAGER_BIN=$(abspath $(RELEASE_DIR))/manager-linux-$$arch VERSION=$(VERSION); \
	  GOOS=linux GOARCH=$$arch GOPROXY=off $(CYCLONEDX_GOMOD) bin -json -noserial -notimestamp -std -licenses -version $(VERSION) \
	    -output $(RELEASE_DIR)/manager-linux-$$arch.cdx.json $(RELEASE_DIR)/manager-linux-$$arch 2>/dev/null; \
	done
	cd hack/tools/image && $(GO) run . $(foreach a,$(RELEASE_ARCHS),-binary $(abspath $(RELEASE_DIR))/manager-linux-$(a)) \
	  -version $(VERSION) -source $(SOURCE_URL) -revision $(REVISION) -created $(SOURCE_DATE_EPOCH) -tag $(IMAGE_REPO):$(VERSION) \
	  -oci $(abspath $(RELEASE_DIR))/image -oci-archive $(abspath $(RELEASE_DIR))/manager-image.oci.tar -digest-file $(abspath $(RELEASE_DIR))/image-digest
	@# The CLI: a binary per platform in cli/, each packed as krew expects;
	@# the linux ones make its image.
	set -e; for p in $(CLI_PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=false -ldflags "$(CLI_LDFLAGS)" \
	    -o $(RELEASE_DIR)/cli/lockwarden-$$os-$$arch ./cmd/lockwarden; \
	done
	cd hack/tools/release && set -e; for p in $(CLI_PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; \
	  $(GO) run ./archive -mtime $(SOURCE_DATE_EPOCH) -o $(abspath $(RELEASE_DIR))/kubectl-lockwarden_$${os}_$${arch}.tar.gz \
	    kubectl-lockwarden=$(abspath $(RELEASE_DIR))/cli/lockwarden-$$os-$$arch $(abspath $(wildcard LICENSE)); \
	done
	cd hack/tools/release && $(GO) run ./krew -version $(VERSION) -homepage $(SOURCE_URL) -url-base $(RELEASE_URL) \
	  -o $(abspath $(RELEASE_DIR))/lockwarden.yaml $(abspath $(RELEASE_DIR))/kubectl-lockwarden_*.tar.gz
	cd hack/tools/image && $(GO) run . -command lockwarden $(foreach p,$(filter linux/%,$(CLI_PLATFORMS)),-binary $(abspath $(RELEASE_DIR))/cli/lockwarden-$(subst /,-,$(p))) \
	  -version $(VERSION) -source $(SOURCE_URL) -revision $(REVISION) -created $(SOURCE_DATE_EPOCH) -tag $(CLI_IMAGE_REPO):$(VERSION) \
	  -oci $(abspath $(RELEASE_DIR))/cli-image -digest-file $(abspath $(RELEASE_DIR))/cli-image-digest
	$(MAKE) --no-print-directory build-installer IMG=$(IMAGE_REPO):$(VERSION)@$$(cat $(RELEASE_DIR)/image-digest) INSTALLER=$(RELEASE_DIR)/install.yaml
	@# The chart, from a copy: version X.Y.Z, appVersion VERSION, the image
	@# IMAGE_REPO with its digest pinned, its README regenerated for those
	@# values.
	set -e; tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; cp -R dist/chart "$$tmp/lockwarden"; \
	  sed -i -e 's/^version: .*/version: $(VERSION:v%=%)/' -e 's/^appVersion: .*/appVersion: "$(VERSION)"/' "$$tmp/lockwarden/Chart.yaml"; \
	  sed -i -e 's/^    digest: ""$$/    digest: "'"$$(cat $(RELEASE_DIR)/image-digest)"'"/' \
	    -e 's|^    repository: .*|    repository: $(IMAGE_REPO)|' "$$tmp/lockwarden/values.yaml"; \
	  grep -q '^    digest: "sha256:' "$$tmp/lockwarden/values.yaml"; \
	  [[ "$$(grep -c '^    repository: ' "$$tmp/lockwarden/values.yaml")" == 1 ]]; \
	  (cd hack/tools/release && $(GO) run ./chartdoc -chart "$$tmp/lockwarden"); \
	  $(HELM) lint --strict --kube-version 1.36.0 "$$tmp/lockwarden" >/dev/null; \
	  $(HELM) package "$$tmp/lockwarden" -d $(abspath $(RELEASE_DIR)) >/dev/null
	cd hack/tools/release && $(GO) run ./normtgz -mtime $(SOURCE_DATE_EPOCH) $(abspath $(RELEASE_DIR))/lockwarden-$(VERSION:v%=%).tgz
	awk -v v="$(VERSION)" '/^## /{p=($$2==v || $$2=="["v"]")} p' $(CHANGELOG) >$(RELEASE_DIR)/release-notes.md
	@[[ -s $(RELEASE_DIR)/release-notes.md ]] || awk '/^## /{p=($$2=="Unreleased")} p' $(CHANGELOG) >$(RELEASE_DIR)/release-notes.md
	cd $(RELEASE_DIR) && sha256sum $$(find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort) >SHA256SUMS
	@echo "release $(VERSION) in $(RELEASE_DIR): image $(IMAGE_REPO):$(VERSION)@$$(cat $(RELEASE_DIR)/image-digest)"

# `make publish REGISTRY=ghcr.io/you VERSION=v0.2.0` builds the release as
# `make release` does, for that registry, and pushes it there: the manager
# image (REGISTRY/manager), the CLI image (REGISTRY/lockwarden-cli), the
# chart (oci://REGISTRY/charts/lockwarden), the release's files as one OCI
# artifact (REGISTRY/lockwarden-release), each signed with cosign and the
# key pair COSIGN_KEY (its password in $$COSIGN_PASSWORD), the SBOMs
# attached to the image as attestations. No transparency log, no Fulcio:
# cosign.pub is all a user needs to verify. docs/releasing.md is the
# maintainer's whole procedure.
COSIGN ?= $(LOCALBIN)/cosign
COSIGN_VERSION ?= v3.1.3
COSIGN_KEY ?= cosign.key

.PHONY: publish
publish: helm cosign ## Build release VERSION for REGISTRY (HOST[/PATH], required) and publish it there, signed with COSIGN_KEY: images, chart (OCI), CLI archives, krew manifest, SBOM attestations, install.yaml, notes (docs/releasing.md).
	@[[ "$(origin REGISTRY)" == "command line" || "$(origin REGISTRY)" == environment ]] || { echo "make publish: name the registry to publish to, e.g. REGISTRY=ghcr.io/lockwarden" >&2; exit 1; }
	@[[ -f "$(COSIGN_KEY)" ]] || { echo "make publish: no cosign key $(COSIGN_KEY): make a pair with '$(COSIGN) generate-key-pair', or set COSIGN_KEY (docs/releasing.md)" >&2; exit 1; }
	@awk -v v="$(VERSION)" '/^## /{if ($$2==v || $$2=="["v"]") f=1} END{exit !f}' $(CHANGELOG) || { echo "make publish: $(CHANGELOG) has no section '## $(VERSION)' for the release notes" >&2; exit 1; }
	$(MAKE) --no-print-directory release IMAGE_REPO=$(REGISTRY)/manager CLI_IMAGE_REPO=$(REGISTRY)/lockwarden-cli
	cd hack/tools/release && $(GO) run ./publish -dir $(abspath $(RELEASE_DIR)) -registry $(REGISTRY) -version $(VERSION) \
	  -key $(abspath $(COSIGN_KEY)) -cosign $(COSIGN) -helm $(HELM)

.PHONY: cosign
cosign: $(COSIGN) ## Build cosign (signatures and attestations) into bin/.
$(COSIGN): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install -trimpath -ldflags "-X sigs.k8s.io/release-utils/version.gitVersion=$(COSIGN_VERSION)" github.com/sigstore/cosign/v3/cmd/cosign@$(COSIGN_VERSION)

.PHONY: cyclonedx-gomod
cyclonedx-gomod: $(CYCLONEDX_GOMOD) ## Build cyclonedx-gomod (the SBOM generator) into bin/.
$(CYCLONEDX_GOMOD): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install -trimpath github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_GOMOD_VERSION)

##@ Dependencies

.PHONY: test-deps
test-deps: redis envtest plane kustomize helm crd-ref-docs cosign ## Install everything the tests need.

.PHONY: redis
redis: ## Install redis-server 7.x (Debian's package) if it is missing.
	hack/install-redis.sh

.PHONY: envtest
envtest: ## Build etcd, kube-apiserver and kubectl for envtest into bin/k8s (first build takes minutes).
	hack/setup-envtest.sh >/dev/null

.PHONY: plane
plane: envtest ## Build kube-controller-manager, kube-scheduler and kwok for the local control plane into bin/k8s (reuses kube-apiserver's build).
	hack/setup-plane.sh >/dev/null

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Build controller-gen into bin/.
$(CONTROLLER_GEN): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

.PHONY: crd-ref-docs
crd-ref-docs: $(CRD_REF_DOCS) ## Build crd-ref-docs (the API reference's generator) into bin/.
$(CRD_REF_DOCS): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install github.com/elastic/crd-ref-docs@$(CRD_REF_DOCS_VERSION)

# Each linter's version in the binary's name, so a version change in this
# Makefile rebuilds it although bin/ is shared.
.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Build golangci-lint into bin/.
$(GOLANGCI_LINT): $(GOLANGCI_LINT)-$(GOLANGCI_LINT_VERSION)
	ln -sf $(notdir $<) $@
$(GOLANGCI_LINT)-$(GOLANGCI_LINT_VERSION): | $(LOCALBIN)
	tmp="$$(mktemp -d)" && trap 'rm -rf "$$tmp"' EXIT && \
	  GOBIN="$$tmp" $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) && \
	  mv "$$tmp/golangci-lint" $@

$(ACTIONLINT): $(ACTIONLINT)-$(ACTIONLINT_VERSION)
	ln -sf $(notdir $<) $@
$(ACTIONLINT)-$(ACTIONLINT_VERSION): | $(LOCALBIN)
	tmp="$$(mktemp -d)" && trap 'rm -rf "$$tmp"' EXIT && \
	  GOBIN="$$tmp" $(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION) && \
	  mv "$$tmp/actionlint" $@

.PHONY: kustomize
kustomize: $(KUSTOMIZE) ## Build kustomize into bin/.
$(KUSTOMIZE): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

##@ Helm chart

# The ldflags are Helm's own Makefile's: without them `helm version` says
# nothing and `helm template` assumes Kubernetes 1.20, below the chart's
# kubeVersion (the chart's tests pass --kube-version).
.PHONY: helm
helm: $(HELM) ## Build helm into bin/ (for the chart in dist/chart).
$(HELM): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install -ldflags "-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=36 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=36" helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

.PHONY: helm-lint
helm-lint: helm ## Lint the chart in dist/chart against its values.schema.json, warnings as errors (make test also renders it and compares it with config/default).
	$(HELM) lint --strict --kube-version 1.36.0 dist/chart

.PHONY: chart-readme
chart-readme: ## Write dist/chart/README.md from the values' comments (make test fails when it is out of date).
	cd hack/tools/release && $(GO) run ./chartdoc -chart $(CURDIR)/dist/chart

$(LOCALBIN):
	mkdir -p $(LOCALBIN)
