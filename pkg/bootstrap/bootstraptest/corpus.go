package bootstraptest

import (
	"embed"
	"io/fs"
	"path"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/txtar"
)

// corpus is the runtime-config corpus that ships with the repository: one txtar archive per
// shape of configuration under testdata/corpus/<runtime>/<shape>.txtar. Each archive is a
// host tree — every member is named by its absolute host path (/etc/containerd/config.toml,
// /etc/os-release, …) — and its comment says which shape it is and what it is modelled on.
// The files are written for nodecache; the third-party files in $NODECACHE_FIXTURES (Fixtures)
// are a separate, optional set.
//
//go:embed testdata/corpus
var corpus embed.FS

// CorpusShapes lists the shapes of one runtime ("containerd", "crio"), sorted, as
// "<runtime>/<shape>" without the .txtar suffix: the names CorpusHost and CorpusFile take.
func CorpusShapes(t testing.TB, runtime string) []string {
	t.Helper()
	ents, err := fs.ReadDir(corpus, path.Join("testdata/corpus", runtime))
	if err != nil {
		t.Fatalf("corpus %s: %v", runtime, err)
	}
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".txtar"); ok && !e.IsDir() {
			out = append(out, runtime+"/"+n)
		}
	}
	if len(out) == 0 {
		t.Fatalf("corpus %s: no shapes", runtime)
	}
	slices.Sort(out)
	return out
}

// Corpus returns the host files of one shape ("containerd/schema2-no-registry"): absolute host
// path -> content. A shape that does not exist, a member that is not an absolute clean path, or
// the same path twice fails the test.
func Corpus(t testing.TB, shape string) map[string][]byte {
	t.Helper()
	data, err := corpus.ReadFile(path.Join("testdata/corpus", shape+".txtar"))
	if err != nil {
		t.Fatalf("corpus shape %s: %v", shape, err)
	}
	ar := txtar.Parse(data)
	if len(ar.Files) == 0 {
		t.Fatalf("corpus shape %s holds no files", shape)
	}
	files := make(map[string][]byte, len(ar.Files))
	for _, f := range ar.Files {
		if !path.IsAbs(f.Name) || path.Clean(f.Name) != f.Name {
			t.Fatalf("corpus shape %s: member %q is not an absolute clean host path", shape, f.Name)
		}
		if _, dup := files[f.Name]; dup {
			t.Fatalf("corpus shape %s: %s twice", shape, f.Name)
		}
		files[f.Name] = f.Data
	}
	return files
}

// CorpusFile returns one host file of a shape; a missing member fails the test.
func CorpusFile(t testing.TB, shape, hostPath string) []byte {
	t.Helper()
	b, ok := Corpus(t, shape)[hostPath]
	if !ok {
		t.Fatalf("corpus shape %s has no %s", shape, hostPath)
	}
	return b
}

// CorpusHost writes every file of a shape under root (a host root such as t.TempDir()) and
// returns them as Corpus does.
func CorpusHost(t testing.TB, root, shape string) map[string][]byte {
	t.Helper()
	files := Corpus(t, shape)
	for p, b := range files {
		WriteHostFile(t, root, p, b)
	}
	return files
}
