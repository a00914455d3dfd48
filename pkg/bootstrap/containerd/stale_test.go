package containerd_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker/config"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// TestStaleHostsRemoved: a run with fewer upstreams removes the hosts.toml files an earlier run
// wrote for the others (their directories too when then empty), reports each removal, and
// leaves files without the marker and other files in our directories alone.
func TestStaleHostsRemoved(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, bootstraptest.CorpusFile(t, "containerd/schema2-no-registry", containerd.DefaultConfig))
	certs := "/etc/containerd/certs.d"
	userHosts := []byte("server = 'https://myreg.example'\n")
	bootstraptest.WriteHostFile(t, root, certs+"/myreg.example/hosts.toml", userHosts)
	first := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	second := bootstraptest.Mirror(t, "http://10.0.0.9:5000")

	rep, err := containerd.Plan(os.DirFS(root), containerd.Options{Mirror: first, Daemon: v17,
		Upstreams: []string{"docker.io", "ghcr.io", "registry.k8s.io", "quay.io", "gcr.io", "localhost:5001"}})
	if err != nil {
		t.Fatal(err)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	// A user's certificate in one of our directories keeps that directory.
	bootstraptest.WriteHostFile(t, root, certs+"/quay.io/NOTES", []byte("user's"))

	rep, err = containerd.Plan(os.DirFS(root), containerd.Options{Mirror: second, Daemon: v17, Upstreams: []string{"docker.io"}})
	if err != nil {
		t.Fatal(err)
	}
	var removed []string
	for _, c := range rep.Changes {
		if c.Action == bootstrap.ActionRemove {
			if !strings.HasPrefix(c.Note, "stale: ") {
				t.Errorf("removal of %s not explained: %q", c.Path, c.Note)
			}
			removed = append(removed, c.Path)
		}
	}
	slices.Sort(removed)
	want := []string{certs + "/gcr.io/hosts.toml", certs + "/ghcr.io/hosts.toml", certs + "/localhost_5001_/hosts.toml", certs + "/quay.io/hosts.toml", certs + "/registry.k8s.io/hosts.toml"}
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	if rep.RestartRequired {
		t.Fatal("removing hosts.toml files needs no restart")
	}
	bootstraptest.Apply(t, root, rep.Changes)
	for _, d := range []string{"gcr.io", "ghcr.io", "localhost_5001_", "registry.k8s.io"} {
		if _, err := os.Stat(filepath.Join(root, certs, d)); !os.IsNotExist(err) {
			t.Errorf("%s: directory left: %v", d, err)
		}
	}
	if b := bootstraptest.ReadHostFile(t, root, certs+"/quay.io/NOTES"); string(b) != "user's" {
		t.Fatal("a user's file in our directory was removed")
	}
	if b := bootstraptest.ReadHostFile(t, root, certs+"/myreg.example/hosts.toml"); string(b) != string(userHosts) {
		t.Fatal("a hosts.toml without the marker was touched")
	}
	// containerd's parser: quay.io has no mirror any more, docker.io uses the new one.
	hosts := config.ConfigureHosts(t.Context(), config.HostOptions{HostDir: config.HostDirFromRoot(filepath.Join(root, certs))})
	for name, first := range map[string]string{"quay.io": "quay.io", "docker.io": "10.0.0.9:5000"} {
		rh, err := hosts(name)
		if err != nil || len(rh) == 0 || rh[0].Host != first {
			t.Fatalf("%s: first host %+v (%v), want %s", name, rh, err, first)
		}
	}
}

// TestMigratedHostsAreNotStale: a hosts.toml that holds settings --migrate moved out of
// config.toml is ours but not an upstream's: later runs keep it.
func TestMigratedHostsAreNotStale(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, bootstraptest.CorpusFile(t, "containerd/legacy-mirrors", containerd.DefaultConfig))
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	rep, err := containerd.Plan(os.DirFS(root), containerd.Options{Mirror: m, Daemon: v17, Upstreams: []string{"docker.io"}, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	migrated := "/etc/containerd/certs.d/registry.local_5000_/hosts.toml"
	before := bootstraptest.ReadHostFile(t, root, migrated)
	if before == nil {
		t.Fatal("migrated hosts.toml not written")
	}
	rep, err = containerd.Plan(os.DirFS(root), containerd.Options{Mirror: m, Daemon: v17, Upstreams: []string{"ghcr.io"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Changes {
		if c.Path == migrated && c.Changed() {
			t.Fatalf("migrated settings planned as %s: %s", c.Action, c.Note)
		}
	}
	if !slices.ContainsFunc(rep.Changes, func(c bootstrap.Change) bool {
		return c.Path == "/etc/containerd/certs.d/docker.io/hosts.toml" && c.Action == bootstrap.ActionRemove
	}) {
		t.Fatalf("docker.io (no longer an upstream) not removed: %+v", rep.Changes)
	}
}
