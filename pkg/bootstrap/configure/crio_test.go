package configure

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
)

// tree lists every path under root (relative, slash-separated), directories included.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		out = append(out, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestCrioRemoveUndoesEverything (issue 26): `gen crio --remove` leaves the host as gen found
// it — every file and every directory gen created is gone (before, registries.conf.d,
// crio.conf.d, certs.d and their parents stayed behind, empty), a directory the site had
// stays, and one the site put a file into since stays with that file — and it says nothing
// about the CRI-O version, which a removal does not use (before, it warned "CRI-O version
// unknown").
func TestCrioRemoveUndoesEverything(t *testing.T) {
	t.Parallel()
	ca := string(bootstraptest.CA(t))
	for _, tc := range []struct {
		name  string
		files map[string]string
		// siteFile is written after gen, into a directory gen created: it and its directory stay.
		siteFile string
	}{
		{name: "bare host", files: map[string]string{"/etc/pki/ca.pem": ca}},
		{name: "site directories", files: map[string]string{"/etc/pki/ca.pem": ca,
			"/etc/containers/registries.conf": "unqualified-search-registries = []\n", "/etc/crio/crio.conf": "[crio]\n",
			"/etc/containers/registries.conf.d/10-site.conf": "[[registry]]\nlocation = \"quay.io\"\n"}},
		{name: "site file added after gen", files: map[string]string{"/etc/pki/ca.pem": ca}, siteFile: "/etc/crio/crio.conf.d/10-site.conf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := bootstraptest.HostRoot(t, tc.files)
			before := tree(t, root)
			gen := CrioOptions{Common: Common{Mirror: "https://cache.example:5443", MirrorCA: "/etc/pki/ca.pem", HostRoot: root}, Version: "1.31.0", NoReload: true}
			if _, err := Crio(t.Context(), gen); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"etc/containers/registries.conf.d/90-nodecache.conf", "etc/crio/crio.conf.d/90-nodecache.conf",
				"etc/containers/certs.d/cache.example:5443/nodecache-mirror-ca.crt"} {
				if !slices.Contains(tree(t, root), p) {
					t.Fatalf("gen did not write %s", p)
				}
			}
			if tc.siteFile != "" {
				bootstraptest.WriteHostFile(t, root, tc.siteFile, []byte("[crio.runtime]\n"))
			}
			rep, err := Crio(t.Context(), CrioOptions{Common: Common{Remove: true, HostRoot: root}, NoReload: true})
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			if err := rep.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(text.String(), "version") || len(rep.Warnings) != 0 {
				t.Errorf("a removal speaks of the CRI-O version or warns:\n%s", text.String())
			}
			want := before
			if tc.siteFile != "" {
				want = append(slices.Clone(before), "etc/crio", "etc/crio/crio.conf.d", strings.TrimPrefix(tc.siteFile, "/"))
				slices.Sort(want)
			}
			if got := tree(t, root); !slices.Equal(got, want) {
				t.Errorf("after --remove the host holds\n%s\nwant\n%s\nreport:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), text.String())
			}
			if _, err := os.Stat(filepath.Join(root, "etc/containers")); err != nil && tc.files["/etc/containers/registries.conf"] != "" {
				t.Errorf("the site's /etc/containers is gone: %v", err)
			}
		})
	}
}
