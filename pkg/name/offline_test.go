package name_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/name"
)

// TestParseUpstreamOffline (issue 24): NAME=offline is an upstream with no URL that is never
// asked, the word in any case; it prints back as NAME=offline. A try at the word that is not it
// is refused naming offline and what is accepted, as a *URLError under --upstream NAME, never
// read as a host; host names that only look like words stay hosts.
func TestParseUpstreamOffline(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"docker.io=offline", "docker.io=OFFLINE", " docker.io = Offline "} {
		u, err := name.ParseUpstream(in)
		if err != nil || !u.Offline || u.URL != nil || u.Name != "docker.io" || u.String() != "docker.io=offline" {
			t.Errorf("ParseUpstream(%q) = %+v (%s), %v; want docker.io offline, no URL", in, u, u, err)
		}
	}
	ups, err := name.ParseUpstreams([]string{"docker.io=offline", "ghcr.io=https://ghcr.io", "quay.io=offline"})
	if err != nil || len(ups) != 3 || !ups[0].Offline || ups[1].Offline || !ups[2].Offline {
		t.Fatalf("ParseUpstreams = %+v, %v", ups, err)
	}
	if _, err := name.ParseUpstreams([]string{"docker.io=offline", "index.docker.io"}); err == nil || !strings.Contains(err.Error(), "configured twice") {
		t.Errorf("an offline upstream and its alias: %v, want configured twice", err)
	}

	const want = `did you mean offline? want http://HOST[:PORT], https://HOST[:PORT], or offline`
	for _, bad := range []string{"ofline", "offlne", "offlien", "off-line", "OFF_LINE", "offline:", "offline://", "offline=1", "none", "off", "disabled", "airgapped"} {
		_, err := name.ParseUpstreams([]string{"docker.io=" + bad})
		var ue *name.URLError
		if err == nil || !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), `--upstream docker.io: URL "`+bad+`": `+want) {
			t.Errorf("--upstream docker.io=%s: %v; want %q", bad, err, want)
		}
	}
	// Not tries at the word: what ParseURL says of them stands.
	for in, msg := range map[string]string{
		"docker.io=online":          `URL "online": no scheme: did you mean http://online?`,
		"docker.io=localhost":       `URL "localhost": no scheme: did you mean http://localhost?`,
		"docker.io=offline.example": `URL "offline.example": no scheme: did you mean http://offline.example?`,
		"docker.io=offline:5000":    `URL "offline:5000": no scheme: did you mean http://offline:5000?`,
		"docker.io=":                `URL: required`,
	} {
		if _, err := name.ParseUpstream(in); err == nil || !strings.Contains(err.Error(), msg) || strings.Contains(err.Error(), "did you mean offline") {
			t.Errorf("ParseUpstream(%q): %v; want %q", in, err, msg)
		}
	}
	if u, err := name.ParseUpstream("docker.io=http://offline"); err != nil || u.Offline || u.URL.Host != "offline" {
		t.Errorf("a host named offline: %+v, %v", u, err)
	}
}
