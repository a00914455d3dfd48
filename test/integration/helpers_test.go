// Package integration runs nodecache against real container runtimes: containerd daemons built by
// .ci/build-tools.sh, pulling through CRI exactly as the kubelet does. Every test here skips with
// the reason when a binary is missing on a developer machine and fails instead when CI=true.
package integration

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
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
