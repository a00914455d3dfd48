package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/inventory"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/warm"
)

// TestMessages (issue 26): the words of representative messages, exactly — counts of 0, 1 and
// 2 in warm's and cache's reports ("1 images", "1 blobs fetched" before), a refusal that names
// the containerd release once ("(containerd 2.x)" twice before), and a command without
// arguments that is given one (it said "flags go before arguments" before, for a command that
// takes none).
func TestMessages(t *testing.T) {
	t.Parallel()
	image := func(n int) []warm.ImageReport {
		ims := make([]warm.ImageReport, n)
		for i := range ims {
			ims[i] = warm.ImageReport{Input: "alpine", Reference: "docker.io/library/alpine:3.20", Warm: true, BlobsFetched: 1}
		}
		return ims
	}
	warmTotals := func(images, blobs int) func(*testing.T) string {
		return func(t *testing.T) string {
			return lastLine(t, &warm.Report{Mirror: "http://10.0.0.5:5000", Images: image(images), BlobsFetched: blobs})
		}
	}
	cached := func(n int) []mirrorapi.CachedImage {
		return make([]mirrorapi.CachedImage, n)
	}
	listing := func(images, blobs int) func(*testing.T) string {
		return func(t *testing.T) string {
			return lastLine(t, &inventory.Listing{CacheInventory: mirrorapi.CacheInventory{Images: cached(images), Blobs: blobs, Ready: true}})
		}
	}
	verified := func(n int) func(*testing.T) string {
		return func(t *testing.T) string {
			return lastLine(t, &inventory.Verification{VerifyPass: mirrorapi.VerifyPass{Checked: n}})
		}
	}
	v1Config := bootstraptest.HostRoot(t, map[string]string{"/etc/containerd/config.toml": "[plugins.cri]\n  sandbox_image = \"x\"\n"})
	for _, tc := range []struct {
		name string
		got  func(*testing.T) string
		want string
	}{
		{"warm, 0 images", warmTotals(0, 0), "0 of 0 images warm; 0 blobs fetched, 0 failed, 0 external; 0 B in 0s"},
		{"warm, 1 image", warmTotals(1, 1), "1 of 1 image warm; 1 blob fetched, 0 failed, 0 external; 0 B in 0s"},
		{"warm, 2 images", warmTotals(2, 2), "2 of 2 images warm; 2 blobs fetched, 0 failed, 0 external; 0 B in 0s"},
		{"warm, an image's line", func(t *testing.T) string {
			return strings.Split(render(t, &warm.Report{Images: image(1)}), "\n")[1]
		}, "WARM     docker.io/library/alpine:3.20 (from alpine): 1 blob fetched, 0 failed, 0 B in 0s"},
		{"cache ls, 0", listing(0, 0), "0 images, 0 blobs, 0 B (no cap); 0 pinned, 0 B pinned"},
		{"cache ls, 1", listing(1, 1), "1 image, 1 blob, 0 B (no cap); 0 pinned, 0 B pinned"},
		{"cache ls, 2", listing(2, 2), "2 images, 2 blobs, 0 B (no cap); 0 pinned, 0 B pinned"},
		{"cache verify, 0", verified(0), "verified 0 blobs (0 B) in 0s: clean"},
		{"cache verify, 1", verified(1), "verified 1 blob (0 B) in 0s: clean"},
		{"cache verify, 2", verified(2), "verified 2 blobs (0 B) in 0s: clean"},
		{"cache verify verdict, 1", func(*testing.T) string {
			return inventory.Verdict(&inventory.Verification{VerifyPass: mirrorapi.VerifyPass{Checked: 1, Corrupt: 1}}).Error()
		}, "1 of 1 blob corrupt, 0 unreadable"},
		{"cache verify progress, 1", func(*testing.T) string {
			return inventory.ProgressLine(mirrorapi.VerifyPass{Checked: 1, Blobs: 1})
		}, "verify: 1/1 blob, 0 B of 0 B, 0 corrupt"},
		{"cache verify progress, 2", func(*testing.T) string {
			return inventory.ProgressLine(mirrorapi.VerifyPass{Checked: 1, Blobs: 2})
		}, "verify: 1/2 blobs, 0 B of 0 B, 0 corrupt"},
		{"cache rm, 0 arguments", cliError("cache", "rm"), "invalid input: cache rm takes one UPSTREAM/REPOSITORY@DIGEST or UPSTREAM/REPOSITORY:TAG (as cache ls lists it), got 0 arguments"},
		{"cache rm, 2 arguments", cliError("cache", "rm", "a", "b"), "invalid input: cache rm takes one UPSTREAM/REPOSITORY@DIGEST or UPSTREAM/REPOSITORY:TAG (as cache ls lists it), got 2 arguments"},
		{"argument of a command without any", cliError("gen", "crio", "--mirror", "http://a:1", "extra"), `gen crio takes no arguments, got "extra" (see nodecache gen crio --help)`},
		{"argument of version", cliError("version", "x"), `version takes no arguments, got "x"`},
		{"config without version, containerd known", cliError("gen", "containerd", "--host-root", v1Config, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "2.4.2"),
			"/etc/containerd/config.toml has no `version` key, so containerd v2.4.2 reads it as version 1 and migrates it at every start: " +
				"convert it with `containerd config migrate > /etc/containerd/config.toml.new`, review it, move it in place, then run gen again"},
		{"config without version, containerd assumed", cliError("gen", "containerd", "--host-root", v1Config, "--mirror", "http://10.0.0.5:5000", "--log-level", "error"),
			"/etc/containerd/config.toml has no `version` key, so containerd reads it as the deprecated version 1: " +
				"on containerd 2.x convert it with `containerd config migrate > /etc/containerd/config.toml.new`, review it, move it in place; " +
				"on 1.x add `version = 2` as its first line and name its plugin tables by their full IDs (plugins.cri -> plugins.\"io.containerd.grpc.v1.cri\"); then run gen again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.got(t); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestHelpListsEachCommandOnce (issue 26): `nodecache --help` lists each command once, in its
// COMMANDS list, and its description counts none ("six commands" over a list of eight before).
func TestHelpListsEachCommandOnce(t *testing.T) {
	t.Parallel()
	code, help, stderr := runApp(t, "--help")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, name := range clitext.CommandNames(newApp().VisibleCommands()) {
		if n := len(regexp.MustCompile(`(?m)^ +`+name+`\b`).FindAllString(help, -1)); n != 1 {
			t.Errorf("--help lists %s %d times, want once:\n%s", name, n, help)
		}
	}
	if count := regexp.MustCompile(`(?i)\b(one|two|three|four|five|six|seven|eight|nine|ten|\d+) commands\b`).FindString(help); count != "" {
		t.Errorf("--help counts its commands (%q): the list is the count\n%s", count, help)
	}
}

// render is r's text output.
func render(t *testing.T, r clitext.Renderer) string {
	t.Helper()
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// lastLine is the last line of r's text output: its totals.
func lastLine(t *testing.T, r clitext.Renderer) string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(render(t, r), "\n"), "\n")
	return lines[len(lines)-1]
}

// cliError runs the CLI with args and returns its error message, failing the test unless it
// exits 2 with one "nodecache: " line.
func cliError(args ...string) func(*testing.T) string {
	return func(t *testing.T) string {
		code, _, stderr := runApp(t, args...)
		msg, ok := strings.CutPrefix(strings.TrimSuffix(stderr, "\n"), "nodecache: ")
		if code != exitUsage || !ok || strings.Contains(msg, "\n") {
			t.Fatalf("%q: exit %d, stderr %q; want exit 2 and one error line", args, code, stderr)
		}
		return msg
	}
}
