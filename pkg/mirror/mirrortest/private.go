package mirrortest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd" // access controller
	"github.com/google/go-containerregistry/pkg/authn"
	"golang.org/x/crypto/bcrypt"
)

// NewPrivateRegistry starts distribution's registry like NewRegistry, with its htpasswd access
// controller: every request needs HTTP Basic authentication as user with password; anonymous
// ones get 401 with a Basic challenge. The registry's pushers (PushImage, PushIndex) use those
// credentials.
func NewPrivateRegistry(t testing.TB, user, password string) *Registry {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatalf("htpasswd: %v", err)
	}
	file := filepath.Join(t.TempDir(), "htpasswd")
	if err := os.WriteFile(file, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := NewRegistryWithConfig(t, func(cfg *configuration.Configuration) {
		cfg.Auth = configuration.Auth{"htpasswd": configuration.Parameters{"realm": "nodecache-test", "path": file}}
	})
	r.auth = authn.FromConfig(authn.AuthConfig{Username: user, Password: password})
	return r
}
