# nodecache — build, test and run.
#   make run     serve the default upstreams on :5000 with filesystem storage in ./.nodecache
#   make test    every test (unit, end-to-end, real containerd daemons when their binaries exist)
#   make ci      what CI runs: build the test tools (containerd daemons, skopeo), then make test
#   make test-deploy  the chart, manifests, dashboard, Dockerfile, release and systemd checks
#                (their own module, deploy/test: Helm, kustomize, Prometheus, BuildKit stay out of go.mod)

GO        ?= go
BIN       ?= bin/nodecache
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/nodecache/nodecache/internal/buildinfo.version=$(VERSION)
GOTAGS    ?= containers_image_openpgp,exclude_graphdriver_btrfs
TESTFLAGS ?= -count=1 -timeout 30m
ROOT      ?= $(CURDIR)/.nodecache
LISTEN    ?= 127.0.0.1:5000

export NODECACHE_FIXTURES ?= $(abspath $(CURDIR)/../shared/fixtures)

# golangci-lint, pinned, built once into the tools cache (.ci/build-tools.sh does the same).
GOLANGCI_LINT_VERSION := v2.15.0
TOOLS         ?= $(or $(NODECACHE_TOOLS),$(HOME)/.cache/nodecache-ci)
GOLANGCI_LINT := $(TOOLS)/golangci-lint-$(GOLANGCI_LINT_VERSION)/golangci-lint

.PHONY: all build run test test-deploy ci lint vet fmt tidy bench clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -tags '$(GOTAGS)' -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/nodecache

run: build
	$(BIN) serve --root $(ROOT) --listen $(LISTEN) --log-format console

# test ends with one `skip: <test>: <reason>` line per skipped test and `N passed, N failed,
# N skipped` (internal/testsummary over `go test -json`); failing tests print their whole output.
# TESTFLAGS=-v prints every test's output as it runs.
test:
	$(GO) build -o bin/testsummary ./internal/testsummary
	bin/testsummary $(filter -v,$(TESTFLAGS)) -- $(GO) test -json -tags '$(GOTAGS)' $(filter-out -v,$(TESTFLAGS)) ./...

test-deploy: build
	cd deploy/test && GOWORK=off NODECACHE_BINARY=$(abspath $(BIN)) $(GO) test $(TESTFLAGS) ./...

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

$(GOLANGCI_LINT):
	GOBIN=$(dir $@) GOWORK=off $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

tidy:
	$(GO) mod tidy

bench:
	$(GO) test -tags '$(GOTAGS)' -run '^$$' -bench . -benchmem ./pkg/mirror/...

clean:
	rm -rf bin .nodecache
