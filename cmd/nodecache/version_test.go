package main

import (
	"encoding/json"
	"errors"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/internal/buildinfo"
)

// moduleVersion is the version of path in this test binary's own build: the same module graph
// the nodecache binary is built from.
func moduleVersion(t *testing.T, path string) string {
	t.Helper()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("test binary has no build info")
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	t.Fatalf("%s is not linked into the test binary", path)
	return ""
}

// TestVersionJSON: `nodecache version --output json` names the library versions built in, as
// the module graph says, and the running platform.
func TestVersionJSON(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), binary, "version", "--output", "json").Output()
	if err != nil {
		t.Fatalf("version --output json: %v", err)
	}
	var got buildinfo.Info
	dec := json.NewDecoder(strings.NewReader(string(out)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	want := map[string][2]string{
		"talos_machinery": {got.TalosMachinery, moduleVersion(t, buildinfo.TalosMachineryModule)},
		"containerd":      {got.Containerd, moduleVersion(t, buildinfo.ContainerdModule)},
		"distribution":    {got.Distribution, moduleVersion(t, buildinfo.DistributionModule)},
		"platform":        {got.Platform, runtime.GOOS + "/" + runtime.GOARCH},
		"go":              {got.Go, runtime.Version()},
	}
	for field, gw := range want {
		if gw[0] != gw[1] {
			t.Errorf("%s = %q, want %q", field, gw[0], gw[1])
		}
	}
	if got.Version == "" || got.Commit == "" {
		t.Errorf("version %q, commit %q: want both set (dev/unknown when not stamped)", got.Version, got.Commit)
	}
}

// TestVersionText: one line per field; refusals exit 2.
func TestVersionText(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), binary, "version").Output()
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	for _, want := range []string{"nodecache ", "commit ", "talos machinery ", "containerd " + moduleVersion(t, buildinfo.ContainerdModule), "distribution " + moduleVersion(t, buildinfo.DistributionModule)} {
		if !strings.Contains(strings.Join(strings.Fields(string(out)), " "), strings.TrimSpace(want)) {
			t.Errorf("version output lacks %q:\n%s", want, out)
		}
	}
	for _, args := range [][]string{{"version", "--output", "yaml"}, {"version", "extra"}} {
		err := exec.CommandContext(t.Context(), binary, args...).Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
			t.Errorf("%v: %v, want exit %d", args, err, exitUsage)
		}
	}
}
