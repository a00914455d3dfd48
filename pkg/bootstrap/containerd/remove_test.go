package containerd_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// TestRemoveRestoresEmptyConfigAnyVersion (newuser3 item 2): an empty or comments-only
// config.toml that gen gave the `version` of one release (2 for 1.x, 3 for 2.0–2.2, 4 from 2.3)
// is restored byte for byte by --remove whatever release is given then (each pair across the
// schema boundaries, and none with no daemon to ask), the backup goes, nothing is warned; a file
// changed since gen is left with a warning, whichever release is given.
func TestRemoveRestoresEmptyConfigAnyVersion(t *testing.T) {
	t.Parallel()
	m := mustParseMirror(t, "http://127.0.0.1:5000")
	releases := []bootstrap.Version{
		{Major: 1, Minor: 7, Patch: 35}, {Major: 2, Minor: 0, Patch: 5}, {Major: 2, Minor: 2, Patch: 1}, {Major: 2, Minor: 4, Patch: 2},
	}
	originals := map[string][]byte{"empty": {}, "comments only": []byte("# site defaults\n# nothing set")}
	for origName, orig := range originals {
		for _, genV := range releases {
			for _, rmV := range append(releases, bootstrap.Version{}) {
				for _, userEdit := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/gen %s/remove %s/user edit %v", origName, genV, rmV, userEdit), func(t *testing.T) {
						t.Parallel()
						root := t.TempDir()
						bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, orig)
						planApply(t, root, containerd.Options{Mirror: m, Daemon: genV, Upstreams: []string{"docker.io"}}, false)
						gen := bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig)
						if bytes.Equal(gen, orig) || bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig+bootstrap.BackupSuffix) == nil {
							t.Fatalf("gen did not edit config.toml with a backup: %q", gen)
						}
						edited := append(bytes.Clone(gen), "\n# tuned by hand\n"...)
						if userEdit {
							bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, edited)
						}
						rep := planApply(t, root, containerd.Options{Daemon: rmV}, true)
						got := bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig)
						if userEdit {
							if !bytes.Equal(got, edited) || !hasWarning(rep, "changed since nodecache edited it") {
								t.Fatalf("user's edit: config.toml now %q, warnings %q; want it left with a warning", got, rep.Warnings)
							}
							return
						}
						if !bytes.Equal(got, orig) || got == nil {
							t.Fatalf("config.toml = %q, want the original %q (warnings %q)", got, orig, rep.Warnings)
						}
						if bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig+bootstrap.BackupSuffix) != nil {
							t.Fatal("backup left after restore")
						}
						if len(rep.Warnings) != 0 || !rep.RestartRequired {
							t.Fatalf("warnings %q, restart_required %v; want none, true", rep.Warnings, rep.RestartRequired)
						}
					})
				}
			}
		}
	}
}

func hasWarning(rep *containerd.Report, part string) bool {
	for _, w := range rep.Warnings {
		if strings.Contains(w, part) {
			return true
		}
	}
	return false
}
