package activation

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// TestFailingUpstreamRow (issue 25): with --mirror, an upstream whose last exchange failed gets a
// warning row naming the reason and the cause, in the text and the JSON report; the verdict and
// the exit code stay what the runtime's evidence says; once the upstream answers again, the row
// goes.
func TestFailingUpstreamRow(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/app", "v1", mirrortest.Image(t, 512, 1, "linux/amd64"))
	srv := nodecachetest.Start(t, nodecachetest.Options{Upstream: up, Alias: "registry.test", Root: t.TempDir()})

	now := time.Now().Unix()
	n := newContainerdNode(t, &fakeContainerd{version: "v2.3.0"}, now-60, v3Config(certsDir, ""), now-120)
	n.withHosts(certsDir, now-120)
	o := n.mirrorOpts(t, srv.URL)
	base := n.evaluate(o)
	if _, ok := check(base, MirrorRow, "upstream"); ok {
		t.Fatalf("an upstream row before any failure\n%s", dump(base))
	}

	up.Stop()
	clientRequest(t, http.MethodGet, srv.URL+"/v2/team/app/manifests/v1?ns=registry.test", "curl/8")
	r := n.evaluate(o)
	c, ok := check(r, MirrorRow, "upstream")
	if !ok || c.Result != Warn || !strings.Contains(c.Reason, "upstream registry.test is failing") ||
		!strings.Contains(c.Reason, "(connect: ") || !strings.Contains(c.Reason, "connection refused") ||
		!strings.Contains(c.Reason, "last success never") {
		t.Fatalf("upstream row %+v, want a warning naming registry.test, connect and the cause\n%s", c, dump(r))
	}
	if r.State != base.State || r.ExitCode() != base.ExitCode() {
		t.Errorf("a failing upstream changed the verdict: %s (exit %d), was %s (exit %d)", r.State, r.ExitCode(), base.State, base.ExitCode())
	}
	var text, js strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	row := false
	for _, line := range strings.Split(text.String(), "\n") {
		f := strings.Fields(line)
		row = row || len(f) > 3 && f[0] == "mirror" && f[1] == "upstream" && f[2] == "WARN" && strings.Contains(line, "registry.test is failing")
	}
	if !row {
		t.Errorf("text report has no upstream row:\n%s", text.String())
	}
	if !strings.Contains(js.String(), `"runtime": "mirror"`) || !strings.Contains(js.String(), "registry.test is failing") {
		t.Errorf("JSON report has no upstream row:\n%s", js.String())
	}

	up.Start(t)
	clientRequest(t, http.MethodGet, srv.URL+"/v2/team/app/manifests/v1?ns=registry.test", "curl/8")
	if r := n.evaluate(o); func() bool { _, ok := check(r, MirrorRow, "upstream"); return ok }() {
		t.Errorf("the upstream answers again, yet the row stays\n%s", dump(r))
	}
}
