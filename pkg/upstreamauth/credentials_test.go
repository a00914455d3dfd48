package upstreamauth

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

const secret = "s3cret-never-shown"

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestLoadCredentialsLookup: entries are found as docker finds them; what is refused says why
// and never carries the secret.
func TestLoadCredentialsLookup(t *testing.T) {
	t.Parallel()
	hub := `{"auths":{"https://index.docker.io/v1/":{"auth":"` + b64("hubuser:"+secret) + `"}}}`
	cases := []struct {
		name, registry, file string
		wantUser, wantErr    string
	}{
		{name: "docker.io finds index key", registry: "docker.io", file: hub, wantUser: "hubuser"},
		{name: "index.docker.io finds index key", registry: "index.docker.io", file: hub, wantUser: "hubuser"},
		{name: "registry-1.docker.io finds index key", registry: "registry-1.docker.io", file: hub, wantUser: "hubuser"},
		{name: "host key", registry: "ghcr.io", file: `{"auths":{"ghcr.io":{"username":"u","password":"` + secret + `"}}}`, wantUser: "u"},
		{name: "URL key normalised to host", registry: "registry.local:5000",
			file: `{"auths":{"https://registry.local:5000/v2/":{"auth":"` + b64("u2:"+secret) + `"}}}`, wantUser: "u2"},
		{name: "identity token", registry: "quay.io", file: `{"auths":{"quay.io":{"identitytoken":"` + secret + `"}}}`},
		{name: "kubernetes dockerconfigjson with other hosts", registry: "ghcr.io",
			file: `{"auths":{"quay.io":{"auth":"` + b64("q:"+secret) + `"},"ghcr.io":{"auth":"` + b64("g:"+secret) + `"}}}`, wantUser: "g"},
		{name: "no entry for the registry", registry: "ghcr.io", file: hub, wantErr: `has no credentials for ghcr.io (looked up as "ghcr.io"`},
		{name: "docker hub entry under docker.io is not docker's key", registry: "docker.io",
			file: `{"auths":{"docker.io":{"auth":"` + b64("x:"+secret) + `"}}}`, wantErr: `looked up as "https://index.docker.io/v1/"`},
		{name: "not JSON", registry: "ghcr.io", file: `auths: {` + secret, wantErr: "not a docker config.json"},
		{name: "no auths", registry: "ghcr.io", file: `{"psFormat":"x"}`, wantErr: `no "auths", "credHelpers" or "credsStore"`},
		// newuser2 item 19: an "auths" that is there but empty has no entry for the registry.
		{name: "empty auths", registry: "docker.io", file: `{"auths":{}}`, wantErr: `has no credentials for docker.io (looked up as "https://index.docker.io/v1/", as docker does)`},
		{name: "auth not base64", registry: "ghcr.io", file: `{"auths":{"ghcr.io":{"auth":"` + secret + `!"}}}`, wantErr: "not a docker config.json"},
		{name: "missing credential helper", registry: "ghcr.io", file: `{"credHelpers":{"ghcr.io":"nodecache-test-missing"}}`, wantErr: "credential helper"},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "config.json")
			writeFile(t, file, tc.file)
			c, err := LoadCredentials(file, tc.registry, CredentialsOptions{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("the error carries the secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a, err := c.Authorization()
			if err != nil {
				t.Fatal(err)
			}
			if a.Username != tc.wantUser || (a.Password != secret && a.IdentityToken != secret) {
				t.Errorf("got user %q (secret found: %v), want %q", a.Username, a.Password == secret || a.IdentityToken == secret, tc.wantUser)
			}
			if strings.Contains(c.String(), secret) {
				t.Errorf("String() shows the secret: %s", c)
			}
		})
	}
}

// TestCredentialsRecheck: outside token fetches the file is checked at most every
// CredentialsRecheck; a token fetch (Authorization) checks it at once.
func TestCredentialsRecheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "config.json")
	writeFile(t, file, `{"auths":{"ghcr.io":{"auth":"`+b64("a:one")+`"}}}`)
	clock := mirrortest.NewClock(time.Unix(1_700_000_000, 0))
	c, err := LoadCredentials(file, "ghcr.io", CredentialsOptions{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	g0 := c.Generation()
	// Replace the file (new inode), as an editor or a Secret update does.
	tmp := filepath.Join(dir, "new.json")
	writeFile(t, tmp, `{"auths":{"ghcr.io":{"auth":"`+b64("b:two")+`"}}}`)
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	clock.Advance(CredentialsRecheck - time.Second)
	if g := c.Generation(); g != g0 {
		t.Fatalf("generation changed before %s: %d -> %d", CredentialsRecheck, g0, g)
	}
	clock.Advance(time.Second)
	if g := c.Generation(); g == g0 {
		t.Fatalf("generation unchanged after %s", CredentialsRecheck)
	}
	// A token fetch sees a change at once.
	writeFile(t, tmp, `{"auths":{"ghcr.io":{"auth":"`+b64("c:three")+`"}}}`)
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	a, err := c.Authorization()
	if err != nil || a.Username != "c" {
		t.Fatalf("Authorization after a change: %+v, %v; want user c", a, err)
	}
	// A file that breaks keeps the last good credentials.
	writeFile(t, file, `{not json`)
	a, err = c.Authorization()
	if err != nil || a.Username != "c" {
		t.Fatalf("Authorization with a broken file: %+v, %v; want the last good user c", a, err)
	}
	var _ authn.Authenticator = c
}
