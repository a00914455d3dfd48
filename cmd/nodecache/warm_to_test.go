package main

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"

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

// TestWarmToPrivateUpstream: warm --to takes serve's --upstream-auth and --upstream-ca. A bundle
// is written from distribution's htpasswd registry with the credentials of a docker config.json
// and from an https registry whose certificate comes from a private CA (exit 0, both stored).
// Without --upstream-auth, or with a wrong password, the private image is refused by the
// registry (401); without --upstream-ca, or with another CA, the TLS handshake fails (x509),
// and is not retried: exit 1, nothing listed, the report saying what fixes it; the password is
// never printed.
func TestWarmToPrivateUpstream(t *testing.T) {
	t.Parallel()
	mirrortest.QuietLogrus()
	const user, password = "builder", "bundle-pa55word-never-printed"
	private := mirrortest.NewPrivateRegistry(t, user, password)
	private.PushImage(t, "team/private", "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))
	ca := mirrortest.NewCA(t)
	handler := mirrortest.NewHandler(t)
	push := httptest.NewServer(handler)
	t.Cleanup(push.Close)
	(&mirrortest.Registry{Addr: push.Listener.Addr().String()}).PushImage(t, "team/app", "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))
	secure := httptest.NewUnstartedServer(handler)
	secure.TLS = ca.TLSConfig(t, "127.0.0.1")
	secure.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake of the no-CA run
	var handshakes atomic.Int64
	// Set before StartTLS: httptest chains its own connection tracking onto it.
	secure.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			handshakes.Add(1)
		}
	}
	secure.StartTLS()
	t.Cleanup(secure.Close)
	tlsAddr := secure.Listener.Addr().String()

	dir := t.TempDir()
	auth := writeFile(t, dir, "config.json", `{"auths":{"`+private.Addr+`":{"auth":"`+base64.StdEncoding.EncodeToString([]byte(user+":"+password))+`"}}}`)
	caFile := writeFile(t, dir, "ca.pem", string(ca.PEM))
	refs := []string{private.Addr + "/team/private:v1", tlsAddr + "/team/app:v1"}
	args := func(out string, flags ...string) []string {
		return append(append([]string{"warm", "--to", out, "--retries", "0",
			"--upstream", private.Addr + "=http://" + private.Addr, "--upstream", tlsAddr + "=https://" + tlsAddr}, flags...), refs...)
	}

	out := filepath.Join(t.TempDir(), "bundle")
	code, stdout, stderr := runApp(t, args(out, "--upstream-auth", private.Addr+"="+auth, "--upstream-ca", tlsAddr+"="+caFile)...)
	if code != 0 || !strings.Contains(stdout, "bundle written") {
		t.Fatalf("with --upstream-auth and --upstream-ca: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	if im, err := idx.IndexManifest(); err != nil || len(im.Manifests) != len(refs) {
		t.Fatalf("index.json: %v, %v; want %d images", im, err, len(refs))
	}
	if err := validate.Index(idx); err != nil {
		t.Errorf("the bundle's images: %v", err)
	}

	wrongPassword := writeFile(t, dir, "wrong.json", `{"auths":{"`+private.Addr+`":{"auth":"`+base64.StdEncoding.EncodeToString([]byte(user+":not-it"))+`"}}}`)
	otherCA := writeFile(t, dir, "other.pem", string(mirrortest.NewCA(t).PEM))
	for _, tc := range []struct {
		name      string
		flags     []string
		says      []string
		notStored string
	}{
		{"without --upstream-auth", []string{"--upstream-ca", tlsAddr + "=" + caFile},
			[]string{`401 Unauthorized: {"errors":[{"code":"UNAUTHORIZED"`, "(asked anonymously: give the credentials with --upstream-auth " + private.Addr + "=FILE, a docker config.json)"}, refs[0]},
		{"a wrong password", []string{"--upstream-ca", tlsAddr + "=" + caFile, "--upstream-auth", private.Addr + "=" + wrongPassword},
			[]string{"401 Unauthorized", "(the --upstream-auth credentials for " + private.Addr + " were refused: check them, and that they may pull this repository)"}, refs[0]},
		// Retries allowed, but a certificate that is not trusted is not retried.
		{"without --upstream-ca", []string{"--upstream-auth", private.Addr + "=" + auth, "--retries", "3"},
			[]string{"x509: certificate signed by unknown authority", "(trust its certificate authority with --upstream-ca " + tlsAddr + "=FILE, PEM)"}, refs[1]},
		{"another CA", []string{"--upstream-auth", private.Addr + "=" + auth, "--upstream-ca", tlsAddr + "=" + otherCA},
			[]string{"x509: certificate signed by unknown authority", "(the --upstream-ca given for " + tlsAddr + " did not sign the certificate it presented)"}, refs[1]},
	} {
		out := t.TempDir()
		handshakes.Store(0)
		code, stdout, stderr := runApp(t, args(out, tc.flags...)...)
		if code != exitNegative || !strings.Contains(stdout, "NOT STORED "+tc.notStored) {
			t.Errorf("%s: exit %d, want 1 with %s not stored\nstdout %s\nstderr %s", tc.name, code, tc.notStored, stdout, stderr)
		}
		for _, says := range tc.says {
			if !strings.Contains(stdout+stderr, says) {
				t.Errorf("%s: the output does not say %q\nstdout %s\nstderr %s", tc.name, says, stdout, stderr)
			}
		}
		if n := handshakes.Load(); tc.name == "without --upstream-ca" && n > 2 {
			t.Errorf("%s: %d connections to the https registry with --retries 3; an untrusted certificate is not retried (the ping tries at most https twice)", tc.name, n)
		}
		if strings.Contains(stdout+stderr, password) {
			t.Errorf("%s: the password was printed", tc.name)
		}
		if _, err := os.Stat(filepath.Join(out, "index.json")); err == nil {
			t.Errorf("%s: index.json written", tc.name)
		}
	}
}

// TestWarmToRefused: warm --to refuses (exit 2, nothing sent) a directory that is not a bundle,
// an image whose registry is not an upstream (serve's default set when --upstream is not
// given), --mirror with --to, --platform all without --to, an unknown --format, and
// --upstream-auth or --upstream-ca for a registry that is not an --upstream, or naming a file of
// the wrong kind. Without --to those two are not used, with a note.
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
		{"upstream-auth of another registry", []string{"--to", t.TempDir(), "--upstream", upstream, "--upstream-auth", "ghcr.io=" + foreign + "/notes.txt", ref}, `--upstream-auth "ghcr.io=` + foreign + `/notes.txt": ghcr.io is not among the --upstream names ` + up.Addr},
		{"upstream-auth not a docker config", []string{"--to", t.TempDir(), "--upstream", upstream, "--upstream-auth", up.Addr + "=" + foreign + "/notes.txt", ref}, "--upstream-auth " + up.Addr + ": credentials file " + foreign + "/notes.txt: not a docker config.json"},
		{"upstream-ca not PEM", []string{"--to", t.TempDir(), "--upstream", upstream, "--upstream-ca", up.Addr + "=" + foreign + "/notes.txt", ref}, "holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runApp(t, append([]string{"warm"}, tc.args...)...)
			if code != exitUsage || !strings.Contains(stderr, tc.says) {
				t.Errorf("exit %d, stderr %q: want 2 naming %q (stdout %q)", code, stderr, tc.says, stdout)
			}
		})
	}
	// Without --to they are not used, and said so, not refused: a settings file or environment
	// shared with serve gives them to warm too (second fresh-clone trial: warm --mirror exited 2).
	if code, stdout, stderr := runApp(t, "warm", "--mirror", "http://"+up.Addr, "--upstream-auth", up.Addr+"="+foreign+"/notes.txt", "--print", ref); code != 0 || stdout != ref+"\n" || !strings.Contains(stderr, "note: --upstream-auth and --upstream-ca not used: they apply only with --to") {
		t.Errorf("warm --print with --upstream-auth: exit %d, stdout %q, stderr %q; want 0, the reference, a note", code, stdout, stderr)
	}
	if got, _ := os.ReadDir(foreign); len(got) != 1 {
		t.Errorf("the refused directory changed: %v", got)
	}
}
