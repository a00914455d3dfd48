package cache

import (
	"bytes"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// indexFileSeed is an index file as serve writes it at a clean shutdown: one image (an OCI index
// with one child manifest), its config and layer, a tag on each manifest, and a blob no
// manifest references.
const indexFileSeed = `{"version":1,"clean":true,"written":"2026-11-30T10:00:00Z",` +
	`"blobs":{` +
	`"sha256:1111111111111111111111111111111111111111111111111111111111111111":{"size":312,"added":"2026-11-30T09:00:00Z"},` +
	`"sha256:2222222222222222222222222222222222222222222222222222222222222222":{"size":1024,"added":"2026-11-30T09:00:01Z"},` +
	`"sha256:3333333333333333333333333333333333333333333333333333333333333333":{"size":77,"added":"2026-11-30T09:00:02Z"},` +
	`"sha256:4444444444444444444444444444444444444444444444444444444444444444":{"size":4096,"added":"2026-11-30T09:00:03Z","last_read":"2026-11-30T09:30:00+01:00"},` +
	`"sha256:5555555555555555555555555555555555555555555555555555555555555555":{"size":9,"added":"2026-11-30T09:00:04Z"}},` +
	`"repos":{"docker.io/library/alpine":{` +
	`"manifests":{` +
	`"sha256:1111111111111111111111111111111111111111111111111111111111111111":{"refs":["sha256:2222222222222222222222222222222222222222222222222222222222222222"],"last_pulled":"2026-11-30T09:59:00Z"},` +
	`"sha256:2222222222222222222222222222222222222222222222222222222222222222":{"refs":["sha256:3333333333333333333333333333333333333333333333333333333333333333","sha256:4444444444444444444444444444444444444444444444444444444444444444"],"last_pulled":"2026-11-30T09:59:00Z"}},` +
	`"tags":{"3.21":"sha256:1111111111111111111111111111111111111111111111111111111111111111","amd64":"sha256:2222222222222222222222222222222222222222222222222222222222222222"},` +
	`"layers":["sha256:3333333333333333333333333333333333333333333333333333333333333333","sha256:4444444444444444444444444444444444444444444444444444444444444444"]}}}`

// FuzzIndexFile: the index file serve reads at start (ReadFile, then Fill) is refused with a
// message or loaded, never a panic, and reading it changes nothing on disk. A file it loads names
// only storage paths inside their own subtree (a repository or tag must not lead eviction's
// deletes elsewhere), survives eviction of everything it holds, and round-trips: written back
// with Save it reads again, and a second load and save writes the same bytes.
func FuzzIndexFile(f *testing.F) {
	f.Add([]byte(indexFileSeed))
	f.Add([]byte(strings.Replace(indexFileSeed, `"clean":true`, `"clean":false`, 1)))
	f.Add([]byte(strings.Replace(indexFileSeed, `"version":1`, `"version":2`, 1)))
	f.Add([]byte(`{"version":1,"clean":true,"blobs":{},"repos":{}}`))
	f.Add([]byte(`{"version":1,"clean":true,"blobs":null,"repos":null}`))
	f.Add([]byte(`{"version":1,"clean":true,"blobs":{"sha256:00":null},"repos":{"x":null}}`))
	f.Add([]byte(`{"version":1,"clean":true,"repos":{"../../blobs":{"tags":{"..":"sha256:1111111111111111111111111111111111111111111111111111111111111111"}}}}`))
	f.Add([]byte(`{"version":1,`))
	f.Add([]byte(``))
	clock := func() time.Time { return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC) }
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "index.json")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		before, _ := os.Stat(p)
		file, err := ReadFile(p)
		if after, _ := os.Stat(p); !after.ModTime().Equal(before.ModTime()) || after.Size() != before.Size() {
			t.Fatal("ReadFile changed the file it read")
		}
		if got, _ := os.ReadFile(p); !bytes.Equal(got, data) {
			t.Fatal("ReadFile changed the file it read")
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("ReadFile: empty error")
			}
			// A file of another version or written while serving only gives last-pulled hints.
			if file != nil {
				for repo, r := range file.Repos {
					if r == nil {
						continue
					}
					for d := range r.Manifests {
						_ = file.LastPulled(repo, d)
					}
				}
			}
			return
		}
		x := NewIndex()
		x.Fill(file)
		x.MarkReady()
		checkStoragePaths(t, file)
		size, blobs := x.Totals()
		if size < 0 {
			t.Fatalf("loaded index totals %d bytes", size)
		}
		_ = x.Images(func(sr string) (string, string) {
			up, repo, _ := strings.Cut(sr, "/")
			return up, repo
		})
		out := filepath.Join(dir, "out", "index.json")
		if err := x.Save(out, clock, true); err != nil {
			t.Fatalf("a loaded index cannot be saved: %v", err)
		}
		again, err := ReadFile(out)
		if err != nil {
			t.Fatalf("the index saved from a loaded file does not read back: %v", err)
		}
		for d, b := range file.Blobs {
			if g := again.Blobs[d]; g == nil || g.Size != b.Size || !g.Added.Equal(b.Added) {
				t.Fatalf("blob %s: loaded %+v, saved %+v", d, b, g)
			}
		}
		y := NewIndex()
		y.Fill(again)
		y.MarkReady()
		if s2, b2 := y.Totals(); s2 != size || b2 != blobs {
			t.Fatalf("totals %d bytes %d blobs, after a save and load %d bytes %d blobs", size, blobs, s2, b2)
		}
		out2 := filepath.Join(dir, "out2", "index.json")
		if err := y.Save(out2, clock, true); err != nil {
			t.Fatal(err)
		}
		first, _ := os.ReadFile(out)
		second, _ := os.ReadFile(out2)
		if !bytes.Equal(normalized(t, first), normalized(t, second)) {
			t.Fatalf("save, load, save is not stable:\n%s\n%s", first, second)
		}

		drain(t, x, blobs)
	})
}

// normalized is an index file re-encoded through File (map keys sorted by encoding/json), so
// two saves of the same content compare equal whatever order the index iterated in.
func normalized(t *testing.T, b []byte) []byte {
	t.Helper()
	f, err := ReadFile(writeTemp(t, b))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Repos {
		slices.Sort(r.Layers)
	}
	out, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func writeTemp(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "index.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkStoragePaths: every repository, tag and digest of an accepted file names storage paths
// inside its own directory, as eviction deletes them.
func checkStoragePaths(t *testing.T, f *File) {
	t.Helper()
	under := func(p, dir string) {
		if p != path.Clean(p) || !strings.HasPrefix(p, dir+"/") {
			t.Fatalf("storage path %q is not inside %s", p, dir)
		}
	}
	for d := range f.Blobs {
		under(BlobDataPath(d), BlobsRoot)
	}
	for repo, r := range f.Repos {
		dir := RepoRoot + "/" + repo
		under(dir, RepoRoot)
		for d := range r.Manifests {
			under(RevisionPath(repo, d), dir+"/_manifests/revisions")
			under(BlobDataPath(d), BlobsRoot)
		}
		for tag := range r.Tags {
			under(TagPath(repo, tag), dir+"/_manifests/tags")
		}
		for _, d := range r.Layers {
			under(LayerLinkPath(repo, d), dir+"/_layers")
		}
	}
}

// drain evicts everything from x as Store.evict does (NextVictim, RemoveImage, DropBlob): it
// ends, and the totals never go negative.
func drain(t *testing.T, x *Index, blobs int) {
	t.Helper()
	skip := map[Victim]bool{}
	for i := 0; ; i++ {
		if i > 4*blobs+16 {
			t.Fatalf("eviction does not end after %d victims", i)
		}
		v, ok := x.NextVictim(skip)
		if !ok {
			break
		}
		skip[v] = true
		if v.Repo == "" {
			x.DropBlob(v.Manifest)
		} else {
			for _, d := range x.RemoveImage(v.Repo, v.Manifest).Data {
				x.DropBlob(d)
			}
		}
		if size, _ := x.Totals(); size < 0 {
			t.Fatalf("after evicting %+v the index totals %d bytes", v, size)
		}
	}
}
