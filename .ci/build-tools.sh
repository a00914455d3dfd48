# shellcheck shell=bash
# .ci/build-tools.sh — build or reuse the tool binaries the integration tests run.
#
# Usage:
#   source .ci/build-tools.sh   # builds what is missing, then exports the NODECACHE_* variables
#                               # into the calling shell; returns non-zero when a tool is missing.
#   bash .ci/build-tools.sh     # same work; prints the `export` lines on stdout instead.
#
# What it provides (exported variables, absolute paths):
#   NODECACHE_CONTAINERD_2_4  containerd 2.4.x daemon (config schema 3)
#   NODECACHE_CONTAINERD_2_3  containerd 2.3.x daemon (config schema 3)
#   NODECACHE_CONTAINERD_1_7  containerd 1.7.x daemon (config schema 2)
#   NODECACHE_SKOPEO          skopeo (Debian package)
#   NODECACHE_CURL            curl (Debian package)
#   NODECACHE_GOLANGCI_LINT   golangci-lint (what `make lint` runs; the Makefile builds the same path)
#   NODECACHE_OCI_CONFORMANCE the OCI distribution-spec conformance suite (pkg/mirror's TestOCIConformance)
#   NODECACHE_VERSITYGW       versitygw, an S3 gateway over a local directory (pkg/mirror's --storage s3 tests)
#   NODECACHE_CRANE           crane, go-containerregistry's CLI (the README's offline image lines,
#                             deploy/test's TestQuickStartOffline)
#
# Binaries live outside the clone and are reused across runs:
#   ${NODECACHE_TOOLS:-$HOME/.cache/nodecache-ci}/containerd-<version>/containerd
# A binary that already exists is not rebuilt. Builds run two at a time (the machine has 2 cores);
# each writes <dir>/build.log and the binary appears only when its build succeeded.
# The env lines are also written to ${NODECACHE_TOOLS}/env.sh.
#
# Versions (override by env): NODECACHE_CONTAINERD_2_4_VERSION (v2.4.2),
# NODECACHE_CONTAINERD_2_3_VERSION (v2.3.7: the newest 2.3 on the Go module proxy when this was
# written), NODECACHE_CONTAINERD_1_7_VERSION (v1.7.35: likewise for 1.7). golangci-lint is
# v2.15.0 (GOLANGCI_LINT_VERSION in the Makefile), in ${NODECACHE_TOOLS}/golangci-lint-v2.15.0/.
# The conformance suite is github.com/opencontainers/distribution-spec/conformance at
# NODECACHE_OCI_CONFORMANCE_VERSION (v0.0.0-20260831232431-97274622c111), a main package built
# with `go install` into ${NODECACHE_TOOLS}/oci-conformance-<version>/conformance.
# versitygw is github.com/versity/versitygw/cmd/versitygw at NODECACHE_VERSITYGW_VERSION (v1.8.0),
# built with `go install` into ${NODECACHE_TOOLS}/versitygw-<version>/versitygw.
# crane is github.com/google/go-containerregistry/cmd/crane at NODECACHE_CRANE_VERSION (v0.22.1,
# the go-containerregistry of go.mod and the README), in ${NODECACHE_TOOLS}/crane-<version>/crane.
#
# It also maps the test host names (upstream.test, registry.hub.test, auth.hub.test, cdn.test) to
# 127.0.0.1 in /etc/hosts, once, so nothing a test dials leaves the machine, DNS included.
#
# All the work runs in a subshell with `set -euo pipefail`; sourcing changes only the exported
# variables above (and defines the nodecache_build_tools function).

nodecache_build_tools() (
	set -euo pipefail

	local tools="${NODECACHE_TOOLS:-$HOME/.cache/nodecache-ci}"
	local v24="${NODECACHE_CONTAINERD_2_4_VERSION:-v2.4.2}"
	local v23="${NODECACHE_CONTAINERD_2_3_VERSION:-v2.3.7}"
	local v17="${NODECACHE_CONTAINERD_1_7_VERSION:-v1.7.35}"
	local lintv="v2.15.0"
	local lint="$tools/golangci-lint-$lintv/golangci-lint"
	local ociv="${NODECACHE_OCI_CONFORMANCE_VERSION:-v0.0.0-20260831232431-97274622c111}"
	local oci="$tools/oci-conformance-$ociv/conformance"
	local vgwv="${NODECACHE_VERSITYGW_VERSION:-v1.8.0}"
	local vgw="$tools/versitygw-$vgwv/versitygw"
	local cranev="${NODECACHE_CRANE_VERSION:-v0.22.1}"
	local crane="$tools/crane-$cranev/crane"
	local tags="no_btrfs no_devmapper no_zfs"
	# The builds are standalone modules: never let a caller's go.work pull them into a workspace.
	export GOWORK=off
	mkdir -p "$tools" || return 1

	log() { printf 'build-tools: %s\n' "$*" >&2; }

	# The builders do not rely on errexit: a caller may run this function where bash ignores it
	# (an `if` or `||` context), so every step is checked explicitly.

	# build_v2 VERSION: go install of the v2 module's daemon into containerd-VERSION/.
	build_v2() {
		local version="$1" dir="$tools/containerd-$1"
		local tmp="$dir/.gobin"
		rm -rf "$tmp" && mkdir -p "$tmp" || return 1
		if ! GOBIN="$tmp" go install -tags "$tags" \
			"github.com/containerd/containerd/v2/cmd/containerd@$version"; then
			rm -rf "$tmp"
			return 1
		fi
		mv -f "$tmp/containerd" "$dir/containerd" || return 1
		rm -rf "$tmp"
	}

	# build_v1 VERSION: `go install pkg@version` refuses 1.7 (its go.mod has exclude directives),
	# so build it from a throwaway module that requires it.
	build_v1() {
		local version="$1" dir="$tools/containerd-$1"
		local mod rc=0
		mod="$(mktemp -d)" || return 1
		(
			cd "$mod" &&
				go mod init nodecache-ci/containerd-build &&
				go get "github.com/containerd/containerd@$version" &&
				go get "github.com/containerd/containerd/cmd/containerd@$version" &&
				go build -tags "$tags" -o "$dir/containerd.tmp" \
					github.com/containerd/containerd/cmd/containerd
		) || rc=1
		rm -rf "$mod"
		if ((rc != 0)); then
			rm -f "$dir/containerd.tmp"
			return 1
		fi
		mv -f "$dir/containerd.tmp" "$dir/containerd"
	}

	# go_install BIN PKG@VERSION: go install of PKG into BIN (its binary keeps PKG's last path
	# element as its name), through a temporary GOBIN so a failed build leaves no binary.
	go_install() {
		local bin="$1" pkg="$2" tmp
		tmp="$(dirname "$bin")/.gobin"
		rm -rf "$tmp" && mkdir -p "$tmp" || return 1
		if ! GOBIN="$tmp" go install "$pkg"; then
			rm -rf "$tmp"
			return 1
		fi
		mv -f "$tmp/$(basename "$bin")" "$bin" || return 1
		rm -rf "$tmp"
	}

	# start_go_tool LABEL BIN PKG@VERSION: build BIN with go_install in the background unless it
	# exists; judged afterwards by the binary (go_tools).
	local -a go_tools=()
	start_go_tool() {
		local label="$1" bin="$2" pkg="$3"
		go_tools+=("$label:$bin")
		if [[ -x "$bin" ]]; then
			log "$label: reusing $bin"
			return 0
		fi
		while (($(jobs -rp | wc -l) >= 2)); do wait -n || true; done
		mkdir -p "$(dirname "$bin")" || return 1
		log "$label: building (log: $(dirname "$bin")/build.log)"
		go_install "$bin" "$pkg" >"$(dirname "$bin")/build.log" 2>&1 &
		pids+=("$!")
	}

	# start KIND VERSION: run one build in the background unless its binary exists.
	local -a pids=() names=()
	start() {
		local kind="$1" version="$2" dir="$tools/containerd-$2"
		if [[ -x "$dir/containerd" ]]; then
			log "containerd $version: reusing $dir/containerd"
			return 0
		fi
		# At most two builds at once.
		while (($(jobs -rp | wc -l) >= 2)); do wait -n || true; done
		mkdir -p "$dir" || return 1
		log "containerd $version: building (log: $dir/build.log)"
		(
			t0=$SECONDS
			if "build_$kind" "$version" >"$dir/build.log" 2>&1; then
				log "containerd $version: built in $((SECONDS - t0))s"
			else
				exit 1
			fi
		) &
		pids+=("$!")
		names+=("$version")
	}

	ensure_hosts() {
		local line="127.0.0.1 upstream.test registry.hub.test auth.hub.test cdn.test"
		if grep -qxF "$line" /etc/hosts 2>/dev/null; then
			return 0
		fi
		if [[ -w /etc/hosts ]]; then
			printf '%s\n' "$line" >>/etc/hosts
			log "/etc/hosts: added '$line'"
		else
			log "/etc/hosts: not writable; tests that dial *.test names will fail or skip"
		fi
	}

	# skopeo (CRI-O's client library), curl (the TLS listener tests), patch (gen --dry-run
	# diffs are applied with it), zsh and fish (the completion scripts run in them), ip and nft
	# (TestContainerdDialTimeoutFallsBack: a network namespace whose mirror drops SYNs), from
	# Debian: command:package.
	ensure_skopeo() {
		local missing=() tool
		for tool in skopeo curl patch zsh fish ip:iproute2 nft:nftables; do
			command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
		done
		if ((${#missing[@]} == 0)); then
			return 0
		fi
		if [[ $(id -u) -ne 0 ]]; then
			log "${missing[*]} missing and not root: cannot apt-get install it"
			return 0
		fi
		log "installing ${missing[*]} from Debian"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
	}

	local t0=$SECONDS
	ensure_hosts
	start v2 "$v24"
	start v2 "$v23"
	# apt runs while the first two builds do; the third build waits for a free slot.
	local skopeo_status=0
	ensure_skopeo || skopeo_status=$?
	start v1 "$v17"
	start_go_tool "golangci-lint $lintv" "$lint" "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$lintv"
	start_go_tool "oci conformance $ociv" "$oci" "github.com/opencontainers/distribution-spec/conformance@$ociv"
	start_go_tool "versitygw $vgwv" "$vgw" "github.com/versity/versitygw/cmd/versitygw@$vgwv"
	start_go_tool "crane $cranev" "$crane" "github.com/google/go-containerregistry/cmd/crane@$cranev"

	local failed=0 i
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}" || true
	done
	local tool label bin
	for tool in "${go_tools[@]}"; do
		label="${tool%%:*}" bin="${tool#*:}"
		if [[ ! -x "$bin" ]]; then
			log "$label: BUILD FAILED; last lines of $(dirname "$bin")/build.log:"
			tail -n 30 "$(dirname "$bin")/build.log" >&2 || true
			failed=1
		fi
	done
	# Judge by the binaries themselves, whatever the exit codes said.
	for version in "$v24" "$v23" "$v17"; do
		if [[ ! -x "$tools/containerd-$version/containerd" ]]; then
			log "containerd $version: BUILD FAILED; last lines of $tools/containerd-$version/build.log:"
			tail -n 30 "$tools/containerd-$version/build.log" >&2 || true
			failed=1
		fi
	done
	log "done in $((SECONDS - t0))s"

	# The env lines: only tools that exist, so a missing one makes its tests skip (or fail in CI)
	# with a clear reason instead of pointing at nothing.
	local env="$tools/env.sh"
	{
		local name version bin
		for pair in "2_4:$v24" "2_3:$v23" "1_7:$v17"; do
			name="${pair%%:*}" version="${pair#*:}"
			bin="$tools/containerd-$version/containerd"
			if [[ -x "$bin" ]]; then
				printf 'export NODECACHE_CONTAINERD_%s=%q\n' "$name" "$bin"
			fi
		done
		if bin="$(command -v skopeo)"; then
			printf 'export NODECACHE_SKOPEO=%q\n' "$bin"
		fi
		if bin="$(command -v curl)"; then
			printf 'export NODECACHE_CURL=%q\n' "$bin"
		fi
		if [[ -x "$lint" ]]; then
			printf 'export NODECACHE_GOLANGCI_LINT=%q\n' "$lint"
		fi
		if [[ -x "$oci" ]]; then
			printf 'export NODECACHE_OCI_CONFORMANCE=%q\n' "$oci"
		fi
		if [[ -x "$vgw" ]]; then
			printf 'export NODECACHE_VERSITYGW=%q\n' "$vgw"
		fi
		if [[ -x "$crane" ]]; then
			printf 'export NODECACHE_CRANE=%q\n' "$crane"
		fi
	} >"$env.tmp"
	mv -f "$env.tmp" "$env"
	cat "$env"

	if ((failed != 0 || skopeo_status != 0)); then
		return 1
	fi
)

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
	# Sourced: run, then export into the caller's shell. eval only the lines we wrote above.
	if __nodecache_env="$(nodecache_build_tools)"; then
		eval "$__nodecache_env"
		unset __nodecache_env
	else
		eval "$__nodecache_env"
		unset __nodecache_env
		return 1
	fi
else
	nodecache_build_tools
fi
