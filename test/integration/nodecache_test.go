package integration

import (
	"context"
	"fmt"
	"net/url"
	"testing"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

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
