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

export GOWORK = off
GO ?= go
GOTEST_FLAGS ?= -race -count=1 -timeout 40m
# The version `manager --version` prints, stamped in by `make manager`.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
MANAGER_BIN ?= $(LOCALBIN)/manager
# The manager image: `make image` builds it here, `make docker-build` with
# docker; deploy and build-installer point the Deployment at it.
IMG ?= lockwarden/manager:$(VERSION)
CONTAINER_TOOL ?= docker
# Your kubectl and kubeconfig: install, deploy and their reverses act on the
# cluster of its current context.
KUBECTL ?= kubectl
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
IMAGE_BIN ?= $(LOCALBIN)/linux-$(IMAGE_ARCH)/manager
IMAGE_OCI ?= dist/image
IMAGE_TAR ?= dist/image.tar
INSTALLER ?= dist/install.yaml
# What deploy, undeploy and build-installer apply: config/default, or
# config/trial-redis to try lockwarden out with a Redis of its own.
DEPLOY_CONFIG ?= config/default
SOAK_ACQUISITIONS ?= 1000000
# make fault: how long the plane's random fault run injects faults, and the
# seed to replay (empty: a new one, printed).
FAULT_DURATION ?= 20m
FAULT_SEED ?=

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

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods for the API types.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: fmt
fmt: ## Run gofmt on the code.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: vet
vet: ## Run go vet on the main module, the benchmark module and the image builder.
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	cd hack/tools/image && $(GO) vet ./...

.PHONY: test
test: test-deps manifests generate vet ## Run every test, with the race detector, against real redis-server, envtest and the local control plane.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed on:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test $(GOTEST_FLAGS) ./...

.PHONY: soak
soak: test-deps ## Run the fault soak longer than `make test` does: SOAK_ACQUISITIONS (default 1,000,000) under random faults.
	LOCKWARDEN_SOAK_ACQUISITIONS=$(SOAK_ACQUISITIONS) $(GO) test -race -count=1 -timeout 12h -run '^TestSoak$$' -v ./pkg/redislock/

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
# image, or on a libc other than the builder's.
.PHONY: manager
manager: ## Build only the static manager binary into MANAGER_BIN (default bin/manager), stamped with VERSION.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(MANAGER_BIN) ./cmd/manager

# GOOS=linux: the image runs on Linux whatever the host. The builder
# refuses a binary that is not static and linux.
.PHONY: image
image: ## Build the manager image IMG with no docker daemon and no network (no base image): an OCI layout in IMAGE_OCI (dist/image) and a tarball for `docker load` in IMAGE_TAR (dist/image.tar).
	GOOS=linux GOARCH=$(IMAGE_ARCH) $(MAKE) --no-print-directory manager MANAGER_BIN=$(IMAGE_BIN) VERSION=$(VERSION)
	mkdir -p $(dir $(IMAGE_OCI)) $(dir $(IMAGE_TAR))
	cd hack/tools/image && $(GO) run . -binary $(abspath $(IMAGE_BIN)) -version $(VERSION) -tag $(IMG) -oci $(abspath $(IMAGE_OCI)) -tar $(abspath $(IMAGE_TAR))

.PHONY: docker-build
docker-build: ## Build the manager image IMG from the Dockerfile with docker (or CONTAINER_TOOL=podman).
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) -t $(IMG) .

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

##@ Dependencies

.PHONY: test-deps
test-deps: redis envtest plane kustomize helm ## Install everything the tests need.

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

.PHONY: kustomize
kustomize: $(KUSTOMIZE) ## Build kustomize into bin/.
$(KUSTOMIZE): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

##@ Helm chart

.PHONY: helm
helm: $(HELM) ## Build helm into bin/ (for the chart in dist/chart).
$(HELM): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

.PHONY: helm-lint
helm-lint: helm ## Lint the chart in dist/chart (make test also renders it and compares it with config/default).
	$(HELM) lint dist/chart

$(LOCALBIN):
	mkdir -p $(LOCALBIN)
