package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/warm"
)

// TestWarmTo (issue 24): `nodecache warm --to DIR --upstream NAME=URL IMAGE` writes the bundle
// from a real upstream with no cache running (exit 0, progress on stderr, the JSON report naming
// the bundle written), as an OCI image layout by default and as Talos's tree with --format
// talos-flat; a stopped upstream exits 1 with no bundle listed.
func TestWarmTo(t *testing.T) {
	t.Parallel()
	mirrortest.QuietLogrus()
	up := mirrortest.NewRegistry(t)
	up.PushIndex(t, "team/app", "v1", mirrortest.MultiPlatformIndex(t, 4096, 1))
	ref := up.Addr + "/team/app:v1"
	upstream := up.Addr + "=http://" + up.Addr

	for _, tc := range []struct {
		format string
		listed string // the file or directory that lists the images
	}{
		{"", "index.json"},
		{"talos-flat", "manifests/" + strings.Replace(up.Addr, ":", "_", 1) + "_/team/app/reference/v1"},
	} {
		dir := filepath.Join(t.TempDir(), "bundle")
		args := []string{"warm", "--to", dir, "--upstream", upstream, "--platform", "linux/arm64", "--output", "json"}
		if tc.format != "" {
			args = append(args, "--format", tc.format)
		}
		var rep warm.Report
		stderr := runAppJSON(t, &rep, append(args, ref)...)
		want := tc.format
		if want == "" {
			want = "oci"
		}
		if rep.Bundle == nil || !rep.Bundle.Written || string(rep.Bundle.Format) != want || rep.Platform != "linux/arm64" || !rep.Warm {
			t.Errorf("%s: report %+v bundle %+v", want, rep, rep.Bundle)
		}
		if !strings.Contains(stderr, "fetched  "+ref) {
			t.Errorf("%s: no progress line on stderr: %q", want, stderr)
		}
		if _, err := os.Stat(filepath.Join(dir, tc.listed)); err != nil {
			t.Errorf("%s: %v", want, err)
		}
	}

	// The upstream stopped: exit 1, the text report says the bundle was not written, and
	// nothing lists an image.
	dir := t.TempDir()
	up.Stop()
	code, stdout, stderr := runApp(t, "warm", "--to", dir, "--upstream", upstream, "--retries", "0", ref)
	if code != exitNegative || !strings.Contains(stdout, "NOT STORED "+ref) || !strings.Contains(stdout, "bundle NOT written") {
		t.Errorf("stopped upstream: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
		t.Error("index.json written from a stopped upstream")
	}
}

// TestWarmToRefused: warm --to refuses (exit 2, nothing sent) a directory that is not a bundle,
// an image whose registry is not an upstream (serve's default set when --upstream is not
// given), --mirror with --to, --platform all without --to and an unknown --format.
func TestWarmToRefused(t *testing.T) {
	t.Parallel()
	up := newSilentMirror(t, "refused warm --to")
	ref := up.Addr + "/team/app:v1"
	upstream := up.Addr + "=http://" + up.Addr
	foreign := t.TempDir()
	writeFile(t, foreign, "notes.txt", "mine")
	b, err := json.Marshal(map[string]string{"imageLayoutVersion": "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	layout := t.TempDir()
	writeFile(t, layout, "oci-layout", string(b))
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"foreign directory", []string{"--to", foreign, "--upstream", upstream, ref}, "--to " + foreign + " is not empty and is not an OCI image layout (no oci-layout file; it holds notes.txt)"},
		{"layout as talos", []string{"--to", layout, "--format", "talos-flat", "--upstream", upstream, ref}, "add to it with --format oci"},
		{"a file", []string{"--to", filepath.Join(foreign, "notes.txt"), "--upstream", upstream, ref}, "is not a directory"},
		{"default upstreams", []string{"--to", t.TempDir(), ref}, "its registry " + up.Addr + " is not an --upstream (configured: docker.io, ghcr.io, registry.k8s.io, quay.io, gcr.io)"},
		{"mirror and to", []string{"--to", t.TempDir(), "--mirror", "http://" + up.Addr, ref}, "warm fills a mirror or writes a bundle, not both"},
		{"platform all without to", []string{"--mirror", "http://" + up.Addr, "--platform", "all", ref}, "all applies only with --to"},
		{"format", []string{"--to", t.TempDir(), "--format", "tar", "--upstream", upstream, ref}, `--format "tar" refused: want oci`},
		{"upstream", []string{"--to", t.TempDir(), "--upstream", "ftp://x", ref}, "--upstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runApp(t, append([]string{"warm"}, tc.args...)...)
			if code != exitUsage || !strings.Contains(stderr, tc.says) {
				t.Errorf("exit %d, stderr %q: want 2 naming %q (stdout %q)", code, stderr, tc.says, stdout)
			}
		})
	}
	if got, _ := os.ReadDir(foreign); len(got) != 1 {
		t.Errorf("the refused directory changed: %v", got)
	}
}
