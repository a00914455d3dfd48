package mirror_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// talosFlat is the --layout flat Talos image cache fixture (pkg/bundle/testdata/talos).
var talosFlat = filepath.Join("..", "bundle", "testdata", "talos", "flat")

// offline returns the upstreams names, each offline (NAME=offline: never asked).
func offline(t *testing.T, names ...string) []regname.Upstream {
	t.Helper()
	var out []regname.Upstream
	for _, n := range names {
		out = append(out, parseUpstream(t, n+"="+regname.Offline))
	}
	return out
}

// serveSeeded serves a mirror with Options.Seed seed (its bundle opened only once gate is
// closed) until the test ends; it returns the mirror, its address and Serve's result.
func serveSeeded(t *testing.T, seed string, gate chan struct{}) (*mirror.Mirror, string, chan error) {
	t.Helper()
	log := &mirrortest.LogBuffer{}
	m, err := mirror.New(t.Context(), mirror.Options{Root: t.TempDir(), Upstreams: offline(t, "upstream.test:5000", "docker.io"),
		Seed: seed, Logger: zerolog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	mirror.SetOpenBundle(m, func(ctx context.Context, dir string, opts bundle.ReadOptions) (*bundle.Reader, error) {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return bundle.Open(ctx, dir, opts)
	})
	ctx, stop := context.WithCancel(context.Background())
	addr, done := make(chan string, 1), make(chan error, 1)
	go func() {
		done <- mirror.Serve(ctx, m, mirror.ServeOptions{Listen: "127.0.0.1:0", OnListen: func(a net.Addr) { addr <- a.String() }})
	}()
	t.Cleanup(func() {
		stop()
		<-done
		_ = m.Close()
		if t.Failed() {
			t.Logf("nodecache log:\n%s", log.String())
		}
	})
	select {
	case a := <-addr:
		return m, a, done
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	return nil, "", nil
}

// TestSeedReadiness (issue 24, serve --seed): while the bundle is being stored, /readyz answers
// 503 saying so and the images are not served; once it is stored, /readyz answers 200 and every
// image of the bundle is listed and served, its upstreams offline.
func TestSeedReadiness(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	m, addr, _ := serveSeeded(t, talosFlat, gate)
	base := "http://" + addr
	resp, body := get(t, http.MethodGet, base+"/readyz", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "seeding the cache from "+talosFlat+" (--seed)") {
		t.Fatalf("/readyz while seeding: %s %s, want 503 saying it seeds", resp.Status, body)
	}
	if len(m.Inventory().Images) != 0 {
		t.Fatal("images stored before the seed was read")
	}
	close(gate)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, body = get(t, http.MethodGet, base+"/readyz", nil)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never ready: %s %s", resp.Status, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if inv := m.Inventory(); len(inv.Images) != 3 {
		t.Fatalf("inventory once ready: %+v, want the bundle's 3 images", inv.Images)
	}
	resp, body = get(t, http.MethodGet, base+"/v2/docker.io/library/busybox/manifests/1.36", http.Header{"Accept": {mirrorapi.ManifestAccept}})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Content-Digest") != "sha256:ce71abdeebf478604dcd3bfc37d2dcc9408bccfb240bd01c05a22d6b1b9d92cb" {
		t.Fatalf("busybox:1.36 once seeded: %s %s", resp.Status, body)
	}
}

// TestSeedDamaged: a --seed bundle with a blob byte flipped stops serve with an error naming the
// blob and --seed; /readyz never answered 200 and nothing of the bundle was stored.
func TestSeedDamaged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(talosFlat)); err != nil {
		t.Fatal(err)
	}
	const layer = "sha256-ffa38f83ff1fc33819c723cd940fbbf74f05929360da22b9ddd948114ceb43c8"
	p := filepath.Join(dir, "blob", layer)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	close(gate)
	m, _, done := serveSeeded(t, dir, gate)
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err == nil || !strings.Contains(err.Error(), "--seed "+dir) || !strings.Contains(err.Error(), "blob sha256:ffa38f83") || !strings.Contains(err.Error(), "does not match its digest") {
			t.Fatalf("Serve = %v, want the damaged blob named", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop on a damaged --seed")
	}
	if err := m.Ready(t.Context()); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
		t.Errorf("Ready after the failed seed = %v, want the failure", err)
	}
	if size, blobs := m.Inventory().SizeBytes, m.Inventory().Blobs; size != 0 || blobs != 0 {
		t.Errorf("stored after a refused seed: %d bytes, %d blobs", size, blobs)
	}
}
