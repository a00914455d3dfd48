# nodecache — build, test and run.
#   make run     serve the default upstreams on :5000 with filesystem storage in ./.nodecache
#   make test    every test (unit, end-to-end, real containerd daemons when their binaries exist)
#   make ci      what CI runs: build the test tools (containerd daemons, skopeo), then make test
#   make fuzz    every fuzz target for FUZZTIME (default 10s) each, one go test -fuzz per target
#                (.ci/fuzz finds them; FUZZ=FuzzX picks some); a target without a seed corpus fails
#   make release static binaries for linux and darwin (amd64, arm64) with SHA256SUMS in dist/
#   make image   multi-arch container image with docker buildx (IMAGE_FLAGS=--push to publish)
#   make test-faults  the fault suite (issue 23; its own module, test/faults: toxiproxy stays out of
#                go.mod): serve processes against upstreams that reset, cut, throttle, fail, black-hole,
#                corrupt, a SIGKILL, a full disk, damaged files; as root, a minute or two on 2 cores
#   make test-deploy  the chart, manifests, dashboard, Dockerfile, release and systemd checks
#                (their own module, deploy/test: Helm, kustomize, Prometheus, BuildKit stay out of go.mod)
#   make bench   nodecache vs distribution's stock proxy (v3.1.2) as separate processes on loopback:
#                cold/warm pulls, first serve after a restart, a throttled resetting upstream, start-up,
#                eviction, and a cluster of 10 nodes on 127.0.0.2-11 pulling a 200 MiB image through an upstream limited to
#                20 MiB/s in total (stock proxies, nodecache, nodecache --peers); writes
#                bench/RESULTS.md (its own module, bench/: toxiproxy and go-containerregistry stay out
#                of go.mod). Not in CI; ~10 minutes and ~12 GiB of free disk under $TMPDIR.
#                BENCH_ONLY=cluster runs one scenario (comma list of cold,warm,restart,throttled,startup,evict,
#                cluster; the cluster alone rewrites only its section), BENCH_FLAGS=-cluster-mib=20
#                shrinks its image for a quick try. `make lint` vets it.

GO        ?= go
BIN       ?= bin/nodecache
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X github.com/nodecache/nodecache/internal/buildinfo.version=$(VERSION) \
             -X github.com/nodecache/nodecache/internal/buildinfo.commit=$(COMMIT)
GOTAGS    ?= containers_image_openpgp,exclude_graphdriver_btrfs
TESTFLAGS ?= -count=1 -timeout 30m
ROOT      ?= $(CURDIR)/.nodecache
LISTEN    ?= 127.0.0.1:5000
# make local-registry: distribution's registry for trying serve offline, its storage (and the
# config written for it) in REGISTRY_ROOT.
REGISTRY_LISTEN ?= 127.0.0.1:5001
REGISTRY_ROOT   ?= $(CURDIR)/.registry
DIST      ?= dist
# darwin builds serve gen talos and warm users; status and agent exit 2 there ("Linux only").
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
IMAGE     ?= ghcr.io/nodecache/nodecache
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
IMAGE_FLAGS ?=

export NODECACHE_FIXTURES ?= $(abspath $(CURDIR)/../shared/fixtures)

# golangci-lint, pinned, built once into the tools cache (.ci/build-tools.sh does the same).
GOLANGCI_LINT_VERSION := v2.15.0
TOOLS         ?= $(or $(NODECACHE_TOOLS),$(HOME)/.cache/nodecache-ci)
GOLANGCI_LINT := $(TOOLS)/golangci-lint-$(GOLANGCI_LINT_VERSION)/golangci-lint
# distribution's registry, the stock pull-through proxy make bench compares against.
REGISTRY_VERSION := v3.1.2
REGISTRY      := $(TOOLS)/registry-$(REGISTRY_VERSION)/registry

.PHONY: all build run local-registry test test-faults test-deploy fuzz release image notices ci lint vet fmt tidy bench clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -tags '$(GOTAGS)' -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/nodecache

release:
	rm -rf $(DIST) && mkdir -p $(DIST)
	set -e; for p in $(PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; out=$(DIST)/nodecache-$(VERSION)-$$os-$$arch; \
	  echo "release: $$out"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -tags '$(GOTAGS)' -trimpath -ldflags '$(LDFLAGS)' -o $$out ./cmd/nodecache; \
	done
	cp LICENSE THIRD_PARTY_NOTICES.md $(DIST)/
	cd $(DIST) && sha256sum nodecache-* > SHA256SUMS

image:
	@if ! docker buildx version >/dev/null 2>&1; then \
	  echo "make image: docker buildx is not available here (install Docker with the buildx plugin); nothing was built" >&2; exit 1; fi
	docker buildx build --platform $(IMAGE_PLATFORMS) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) \
	  -t $(IMAGE):$(VERSION) $(IMAGE_FLAGS) .

run: build
	$(BIN) serve --root $(ROOT) --listen $(LISTEN) --log-format console

# An upstream on this machine (no internet needed once built): push images to it, then
# NODECACHE_UPSTREAM=docker.io=http://127.0.0.1:5001 make run pulls through it. Its tracing export is
# off (OTEL_TRACES_EXPORTER=none): otherwise it logs a failed OTLP export every ~30 s.
local-registry: $(REGISTRY)
	mkdir -p '$(REGISTRY_ROOT)'
	printf 'version: 0.1\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "%s"}\n' \
		'$(REGISTRY_ROOT)/data' '$(REGISTRY_LISTEN)' > '$(REGISTRY_ROOT)/config.yml'
	OTEL_TRACES_EXPORTER=none exec $(REGISTRY) serve '$(REGISTRY_ROOT)/config.yml'

# test ends with one `skip: <test>: <reason>` line per skip reason (`skip: <N> tests: <reason>
# (<tests>)` for a reason several gave) and `N passed, N failed, N skipped` (internal/testsummary
# over `go test -json`); failing tests print their whole output.
# TESTFLAGS=-v prints every test's output as it runs.
test:
	$(GO) build -o bin/testsummary ./internal/testsummary
	bin/testsummary $(filter -v,$(TESTFLAGS)) -- $(GO) test -json -tags '$(GOTAGS)' $(filter-out -v,$(TESTFLAGS)) ./...

# test-faults prints its seed first and `faults N, requests N, wrong bytes 0, corrupt stored 0,
# crashes 0, failed recoveries 0` last (docs/tests.md, "make test-faults"); NODECACHE_FAULTS_SEED=<seed>
# replays a run's plan. Verbose, so that both lines show in CI output.
test-faults: build
	cd test/faults && GOWORK=off NODECACHE_BINARY=$(abspath $(BIN)) $(GO) test -count=1 -v -timeout 10m -parallel 8 ./...
# fuzz (docs/tests.md, "Fuzzing"): FUZZTIME per target, FUZZ an extended regexp of target names.
FUZZTIME ?= 10s
FUZZ     ?= .
fuzz:
	FUZZTIME='$(FUZZTIME)' FUZZ='$(FUZZ)' GOTAGS='$(GOTAGS)' GO='$(GO)' bash .ci/fuzz

# test-deploy ends like test: one skip line per reason and `N passed, N failed, N skipped`.
test-deploy: build
	$(GO) build -o bin/testsummary ./internal/testsummary
	cd deploy/test && GOWORK=off NODECACHE_BINARY=$(abspath $(BIN)) $(abspath bin/testsummary) $(filter -v,$(TESTFLAGS)) -- \
		$(GO) test -json $(filter-out -v,$(TESTFLAGS)) ./...

# THIRD_PARTY_NOTICES.md from the modules linked into bin/nodecache (after a dependency change).
notices: build
	cd deploy/test && GOWORK=off NODECACHE_BINARY=$(abspath $(BIN)) NODECACHE_UPDATE_NOTICES=1 $(GO) test -count=1 -run TestThirdPartyNotices ./...

ci:
	bash .ci/run

vet:
	$(GO) vet -tags '$(GOTAGS)' ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

lint: vet $(GOLANGCI_LINT)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GOLANGCI_LINT) run ./...
	cd deploy/test && GOWORK=off $(GO) vet ./...
	cd bench && GOWORK=off $(GO) vet ./...
	cd test/faults && GOWORK=off $(GO) vet ./...

$(GOLANGCI_LINT):
	GOBIN=$(dir $@) GOWORK=off $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

tidy:
	$(GO) mod tidy

$(REGISTRY):
	GOBIN=$(dir $@) GOWORK=off $(GO) install github.com/distribution/distribution/v3/cmd/registry@$(REGISTRY_VERSION)

# BENCH_ONLY=cold,startup (or BENCH_FLAGS=-only=cold,startup) runs some scenarios (cold — which includes warm —,
# warm alone, restart, throttled, startup, evict, cluster) to try one out; BENCH_ONLY=cluster rewrites only the cluster
# section of bench/RESULTS.md. BENCH_FLAGS=-cluster-mib=20 shrinks the cluster's 200 MiB image.
# BENCH_BEFORE=<git ref> builds nodecache at that ref too (bin/nodecache-before, from `git archive`), which the
# restart scenario measures beside this tree's build: before and after a change in one run.
BENCH_ONLY   ?=
BENCH_FLAGS  ?=
BENCH_BEFORE ?=
bench: build $(REGISTRY)
	cd bench && GOWORK=off $(GO) build -o ../bin/bench .
	$(if $(BENCH_BEFORE),set -e; d=$$(mktemp -d); git archive --format=tar '$(BENCH_BEFORE)' | tar -x -C $$d; \
	  (cd $$d && CGO_ENABLED=0 GOWORK=off $(GO) build -tags '$(GOTAGS)' -trimpath -o '$(abspath bin/nodecache-before)' ./cmd/nodecache); rm -rf $$d)
	bin/bench -nodecache $(BIN) -registry $(REGISTRY) -commit $(COMMIT) -out bench/RESULTS.md $(if $(BENCH_ONLY),-only $(BENCH_ONLY)) \
	  $(if $(BENCH_BEFORE),-before bin/nodecache-before -before-label '$(BENCH_BEFORE) ($(shell git rev-parse --short $(BENCH_BEFORE) 2>/dev/null))') $(BENCH_FLAGS)

clean:
	rm -rf bin .nodecache $(DIST)
