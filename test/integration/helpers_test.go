// Package integration runs nodecache against real container runtimes: containerd daemons built by
// .ci/build-tools.sh, pulling through CRI exactly as the kubelet does. Every test here skips with
// the reason when a binary is missing on a developer machine and fails instead when CI=true.
package integration

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// pullTimeout bounds one CRI pull of a small test image.
const pullTimeout = 2 * time.Minute

// upstreamName is the registry host of test image references: /etc/hosts maps it to 127.0.0.1
// (.ci/build-tools.sh), so a runtime that bypasses the mirror dials loopback, never DNS.
const upstreamName = "upstream.test"

// upstreamHost returns "upstream.test:<port of r>": a registry name that reaches r.
func upstreamHost(t *testing.T, r *mirrortest.Registry) string {
	t.Helper()
	return nodecachetest.UpstreamHost(t, r, upstreamName)
}

// writeFile writes b to path, creating parent directories.
func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// countManifestsBlobs counts the manifest and the blob requests among request paths.
func countManifestsBlobs(paths []string) (manifests, blobs int) {
	for _, p := range paths {
		switch {
		case strings.Contains(p, "/manifests/"):
			manifests++
		case strings.Contains(p, "/blobs/"):
			blobs++
		}
	}
	return manifests, blobs
}

// checkRuntimeRequests fails the test unless reqs is not empty, every request carries userAgent
// and `ns=<ns>`, and the manifest and at least one blob were fetched.
func checkRuntimeRequests(t *testing.T, reqs []mirrortest.Request, userAgent, ns string) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatalf("the mirror saw no request")
	}
	var paths []string
	for _, r := range reqs {
		paths = append(paths, r.Path)
		q, err := url.ParseQuery(r.RawQuery)
		if err != nil {
			t.Errorf("%s %s?%s: bad query: %v", r.Method, r.Path, r.RawQuery, err)
			continue
		}
		if got := q.Get("ns"); got != ns {
			t.Errorf("%s %s?%s: ns = %q, want %q", r.Method, r.Path, r.RawQuery, got, ns)
		}
		if r.UserAgent != userAgent {
			t.Errorf("%s %s: User-Agent = %q, want %q", r.Method, r.Path, r.UserAgent, userAgent)
		}
	}
	if manifests, blobs := countManifestsBlobs(paths); manifests == 0 || blobs == 0 {
		t.Errorf("mirror saw %d manifest and %d blob requests, want both > 0: %+v", manifests, blobs, reqs)
	}
}

// requireContainerd returns the containerd binary env names, for a test that pulls through a
// real daemon as root from upstream.test: without the binary, root or upstream.test on loopback
// the test skips saying which (and fails when CI=true).
func requireContainerd(t *testing.T, env string) string {
	t.Helper()
	bin := runtimetest.Binary(t, env)
	runtimetest.RequireRoot(t)
	runtimetest.RequireLoopbackName(t, upstreamName)
	return bin
}

// eachContainerd runs test in a parallel subtest "containerd-<version>" for each containerd
// generation, with that generation's binary (requireContainerd).
func eachContainerd(t *testing.T, test func(t *testing.T, bin string)) {
	t.Helper()
	for _, v := range runtimetest.Containerds() {
		t.Run("containerd-"+v.Name, func(t *testing.T) {
			t.Parallel()
			test(t, requireContainerd(t, v.Env))
		})
	}
}

// startNodecache serves mirror.New with upstream (nil: a new, empty one) as its only upstream (name = upstreamHost of
// it, reached at http://upstream.test:<port>) on 127.0.0.1, in memory, until the test ends.
func startNodecache(t *testing.T, upstream *mirrortest.Registry) *nodecachetest.Nodecache {
	t.Helper()
	return nodecachetest.Start(t, nodecachetest.Options{UpstreamName: upstreamName, Upstream: upstream})
}

// writeHostsToml writes at path a hosts.toml that sends host's pulls and resolves to mirror (a
// URL), after head ("", or the managed marker and a newline).
func writeHostsToml(t *testing.T, path, head, host, mirror string) {
	t.Helper()
	writeFile(t, path, fmt.Appendf(nil, "%sserver = \"http://%s\"\n\n[host.\"%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", head, host, mirror))
}

// appUpstream starts an upstream registry that holds team/app:v1, a linux/amd64 image of layers
// layers of layerSize bytes.
func appUpstream(t *testing.T, layerSize int64, layers int) *mirrortest.Registry {
	t.Helper()
	upstream := mirrortest.NewRegistry(t)
	upstream.PushImage(t, "team/app", "v1", mirrortest.Image(t, layerSize, layers, "linux/amd64"))
	return upstream
}

// startAppNodecache is startNodecache in front of a new appUpstream; nc.UpstreamHost names the
// upstream and nc.Upstream is it.
func startAppNodecache(t *testing.T, layerSize int64, layers int) *nodecachetest.Nodecache {
	t.Helper()
	return startNodecache(t, appUpstream(t, layerSize, layers))
}

// appNodecacheAndContainerd starts a nodecache in front of an upstream with team/app:v1
// (startAppNodecache, two 4 KiB layers) and containerd bin on its defaults; certs is where gen
// is to write hosts.toml files, certs.d in the daemon's directory (nothing there yet).
func appNodecacheAndContainerd(t *testing.T, bin string) (nc *nodecachetest.Nodecache, c *runtimetest.Containerd, certs string) {
	t.Helper()
	nc = startAppNodecache(t, 4096, 2)
	c = runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{})
	return nc, c, filepath.Join(c.Dir(), "certs.d")
}

// managedNodecache starts a nodecache in front of a new, empty upstream (startNodecache) and
// writes the hosts.toml gen writes for it (the managed marker, then nc as the mirror of its
// upstream) in certs, in the directory dir names for the upstream's host (name.HostDir, or the
// host:port form containerd 1.7 reads).
func managedNodecache(t *testing.T, certs string, dir func(host string) string) *nodecachetest.Nodecache {
	t.Helper()
	nc := startNodecache(t, nil)
	writeHostsToml(t, filepath.Join(certs, dir(nc.UpstreamHost), "hosts.toml"), mirrorapi.ManagedMarker+"\n", nc.UpstreamHost, nc.URL)
	return nc
}

// criPull pulls ref through c's CRI image service, giving up after pullTimeout.
func criPull(t *testing.T, c *runtimetest.Containerd, ref string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
	defer cancel()
	_, err := c.PullImage(ctx, ref)
	return err
}

// checkAccessLog fails the test unless nodecache logged requests from userAgent with ?ns=ns,
// routed to upstream ns, that fetched the image's manifest and at least one blob successfully.
// Requests from other clients (none expected) are reported.
func checkAccessLog(t *testing.T, lines []nodecachetest.AccessLine, userAgent, ns string) {
	t.Helper()
	var paths []string
	for _, l := range lines {
		if l.UserAgent != userAgent {
			t.Errorf("nodecache logged %s %s from User-Agent %q, want %q", l.Method, l.Path, l.UserAgent, userAgent)
			continue
		}
		paths = append(paths, l.Path)
		q, err := url.ParseQuery(l.Query)
		if err != nil || q.Get("ns") != ns {
			t.Errorf("nodecache logged %s %s?%s: want ns=%s", l.Method, l.Path, l.Query, ns)
		}
		if l.Upstream != ns {
			t.Errorf("nodecache routed %s %s to upstream %q, want %q", l.Method, l.Path, l.Upstream, ns)
		}
		if l.Status >= 400 {
			t.Errorf("nodecache answered %s %s?%s with %d", l.Method, l.Path, l.Query, l.Status)
		}
	}
	if manifests, blobs := countManifestsBlobs(paths); manifests == 0 || blobs == 0 {
		t.Errorf("nodecache logged %d manifest and %d blob requests from %s, want both > 0", manifests, blobs, userAgent)
	}
}
