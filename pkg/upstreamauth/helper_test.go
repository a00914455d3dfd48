package upstreamauth

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// withHelper puts an executable docker-credential-<name> running script (sh) first on PATH for
// the test, and returns a config.json naming it for ghcr.io (credHelpers).
func withHelper(t *testing.T, name, script string) string {
	t.Helper()
	bin := t.TempDir()
	writeFile(t, filepath.Join(bin, "docker-credential-"+name), "#!/bin/sh\n"+script)
	if err := os.Chmod(filepath.Join(bin, "docker-credential-"+name), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	file := filepath.Join(t.TempDir(), "config.json")
	writeFile(t, file, `{"credHelpers":{"ghcr.io":"`+name+`"}}`)
	return file
}

// TestCredentialHelper: a helper's answer is read as docker reads it (a "<token>" username is an
// identity token; its "not found" answer is no credentials); a failing helper's error never
// carries what it printed (fresh-clone trial: a helper that printed a secret and failed had it
// quoted); a helper that does not answer is stopped when the context ends (it hung warm --to).
//
//nolint:paralleltest // t.Setenv(PATH)
func TestCredentialHelper(t *testing.T) {
	t.Run("password", func(t *testing.T) {
		file := withHelper(t, "pw", `cat >/dev/null; echo '{"Username":"u","Secret":"`+secret+`"}'`)
		c, err := LoadCredentials(file, "ghcr.io", CredentialsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a, err := c.Authorization(); err != nil || a.Username != "u" || a.Password != secret {
			t.Errorf("helper's password: %+v, %v", a, err)
		}
	})
	t.Run("identity token", func(t *testing.T) {
		file := withHelper(t, "tok", `cat >/dev/null; echo '{"Username":"<token>","Secret":"`+secret+`"}'`)
		c, err := LoadCredentials(file, "ghcr.io", CredentialsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a, err := c.Authorization(); err != nil || a.IdentityToken != secret || a.Username != "" {
			t.Errorf("helper's identity token: %+v, %v", a, err)
		}
	})
	t.Run("not found", func(t *testing.T) {
		file := withHelper(t, "none", `cat >/dev/null; echo 'credentials not found in native keychain'; exit 1`)
		if _, err := LoadCredentials(file, "ghcr.io", CredentialsOptions{}); err == nil || !strings.Contains(err.Error(), `has no credentials for ghcr.io (looked up as "ghcr.io"`) {
			t.Errorf("a helper without the entry: %v, want no credentials", err)
		}
	})
	t.Run("failure hides the output", func(t *testing.T) {
		file := withHelper(t, "bad", `cat >/dev/null; echo 'partial `+secret+` garbage'; exit 1`)
		_, err := LoadCredentials(file, "ghcr.io", CredentialsOptions{})
		if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "docker-credential-bad get: exit status 1 (what it printed is not shown: it may hold a secret)") {
			t.Errorf("a failing helper: %v, want exit status 1 without its output", err)
		}
	})
	t.Run("no answer", func(t *testing.T) {
		// Answers once (LoadCredentials), then hangs.
		state := filepath.Join(t.TempDir(), "asked")
		file := withHelper(t, "slow", `cat >/dev/null; if [ -e `+state+` ]; then exec sleep 600; fi; touch `+state+`; echo '{"Username":"u","Secret":"s"}'`)
		clock := mirrortest.NewClock(time.Unix(1_700_000_000, 0))
		c, err := LoadCredentials(file, "ghcr.io", CredentialsOptions{Clock: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(CredentialsRecheck) // the helper's answer is asked for again
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = c.AuthorizationContext(ctx)
		if took := time.Since(start); err == nil || !strings.Contains(err.Error(), "docker-credential-slow get: no answer") || took > 5*time.Second {
			t.Errorf("a helper that hangs: %v after %s, want stopped with the context", err, took)
		}
	})
}
