package activation

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// TestCorpusGenThenStatus: for every shape of the runtime-config corpus that gen containerd
// accepts for containerd 2.3, status judges the node before gen NOT active and after gen (config
// written before containerd started) ACTIVE — the two sides agree on every shape, imports
// overriding the registry table included.
func TestCorpusGenThenStatus(t *testing.T) {
	t.Parallel()
	daemon := bcontainerd.Release{Major: 2, Minor: 3, Patch: 1}
	m := bootstraptest.Mirror(t, mirrorURL)
	upstreams := []string{"docker.io", "ghcr.io"}
	// Shapes gen refuses for containerd 2.3 (TestPlanCorpus checks each refusal's wording).
	refused := map[string]bool{
		"containerd/schema1-no-version": true, "containerd/legacy-mirrors": true,
		"containerd/k3s-template": true, "containerd/k3s-agent-path": true, "containerd/talos-marker": true,
	}
	for _, shape := range bootstraptest.CorpusShapes(t, "containerd") {
		t.Run(strings.TrimPrefix(shape, "containerd/"), func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t)
			files := bootstraptest.CorpusHost(t, n.Root, shape)
			rep, err := bcontainerd.Plan(os.DirFS(n.Root), bcontainerd.Options{Mirror: m, Upstreams: upstreams, Daemon: daemon})
			if refused[shape] {
				if err == nil {
					t.Fatal("gen accepted a shape it refuses")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			n.serveContainerd(sock, &fakeContainerd{version: "v2.3.1"})
			n.containerdProc(1000, t0, sock)
			o := n.opts()
			o.Runtime, o.Upstreams = RuntimeContainerd, upstreams
			if _, ok := files[cfgFile]; ok {
				setMtimes(t, n.Root, t0-100)
				if r := n.evaluate(o); r.State != NotActive {
					t.Fatalf("before gen: state %s, want NOT active\n%s", r.State, dump(r))
				}
			}
			bootstraptest.Apply(t, n.Root, rep.Changes)
			setMtimes(t, n.Root, t0-50)
			want(t, n.evaluate(o), Active, 0, "")
		})
	}
}

// setMtimes sets the mtime of every file under root (the host tree, not the proc tree) to sec.
func setMtimes(t *testing.T, root string, sec int64) {
	t.Helper()
	ts := time.Unix(sec, 0)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSocket != 0 || d.IsDir() {
			return err
		}
		return os.Chtimes(p, ts, ts)
	})
	if err != nil {
		t.Fatal(err)
	}
}
