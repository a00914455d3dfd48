// Package upstreamauth gives nodecache's registry clients what they need to reach an upstream
// registry that is not public: its credentials, read from a docker config.json as docker reads
// them (--upstream-auth NAME=FILE), and a private certificate authority to trust
// (--upstream-ca NAME=FILE), and a guard that keeps the credentials to the upstream and its token
// realm. serve and warm --to take the same flags through Load.
package upstreamauth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/configfile"
	"github.com/docker/cli/cli/config/types"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/name"
)

// CredentialsRecheck is how often, at most, a credentials file is stat'ed outside token fetches
// (before each token fetch it always is), and how long a credential helper's answer is reused.
const CredentialsRecheck = 10 * time.Second

// dockerHubKey is where `docker login` stores Docker Hub's credentials in config.json
// (docker/cli configfile; go-containerregistry's authn.DefaultAuthKey).
const dockerHubKey = "https://index.docker.io/v1/"

// Credentials are one upstream's credentials from a docker config.json (or a Kubernetes
// `.dockerconfigjson` Secret key, the same format), looked up as docker does: by docker/cli's
// configfile package, under the registry's host name (entries keyed by a URL such as
// https://ghcr.io/v1/ match too), Docker Hub under https://index.docker.io/v1/ whichever of
// docker.io, index.docker.io or registry-1.docker.io the upstream is named; `auth` or
// `username`/`password`, `identitytoken`, `registrytoken`; `credHelpers` and `credsStore` run
// `docker-credential-<helper>` from PATH.
//
// The file is read again when what its path resolves to — (device, inode, size, mtime), symbolic
// links followed — changed: checked before each token fetch and at most every CredentialsRecheck
// otherwise, so a Kubernetes Secret update (an atomic `..data` symlink swap) takes effect without
// a restart. A file that cannot be read or parsed any more keeps the last good credentials (and
// logs why, never a secret).
//
// Credentials implement authn.Authenticator; their secrets are never put in errors or logs.
// Safe for concurrent use.
type Credentials struct {
	path     string
	registry string // upstream NAME
	key      string // the config.json key looked up
	log      zerolog.Logger
	now      func() time.Time

	mu       sync.Mutex
	stamp    filestamp.Stamp
	statAt   time.Time // last stat
	cf       *configfile.ConfigFile
	gen      uint64 // bumped whenever cf is replaced
	resolved *authn.AuthConfig
	resGen   uint64
	resAt    time.Time
	failing  bool // the last re-read failed (logged once until it works again)
}

var (
	_ authn.Authenticator        = (*Credentials)(nil)
	_ authn.ContextAuthenticator = (*Credentials)(nil)
)

// CredentialsOptions configures LoadCredentials.
type CredentialsOptions struct {
	// Logger receives re-read failures and changes (file and registry names only). Default:
	// disabled.
	Logger zerolog.Logger
	// Clock tells the time for the recheck interval. Default time.Now.
	Clock func() time.Time
}

// LoadCredentials reads path for registry (an upstream NAME such as "ghcr.io" or
// "docker.io") and resolves its entry once (running a credential helper if one is configured).
//
// Errors (none carries a secret): the file cannot be read or is not a docker config; it has no
// credentials for registry (naming the key looked up); a credential helper failed.
func LoadCredentials(path, registry string, opts CredentialsOptions) (*Credentials, error) {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	c := &Credentials{
		path: path, registry: registry, key: credentialKey(registry),
		log: opts.Logger, now: opts.Clock,
	}
	st, cf, err := c.read()
	if err != nil {
		return nil, err
	}
	c.stamp, c.cf, c.gen, c.statAt = st, cf, 1, c.now()
	auth, err := c.lookup(context.Background(), cf)
	if err != nil {
		return nil, err
	}
	if *auth == (authn.AuthConfig{}) {
		return nil, fmt.Errorf("credentials file %s has no credentials for %s (looked up as %q, as docker does)", path, registry, c.key)
	}
	c.resolved, c.resGen, c.resAt = auth, c.gen, c.now()
	return c, nil
}

// credentialKey is the config.json key docker looks registry up under.
func credentialKey(registry string) string {
	if name.Canonical(registry) == name.DockerHub {
		return dockerHubKey
	}
	return registry
}

// Path is the file the credentials come from.
func (c *Credentials) Path() string { return c.path }

// Key is the config.json key they are looked up under.
func (c *Credentials) Key() string { return c.key }

// String names the credentials without revealing them.
func (c *Credentials) String() string {
	return fmt.Sprintf("credentials for %s from %s", c.registry, c.path)
}

// Generation changes whenever the file was read again after a change; it checks the file at
// most every CredentialsRecheck.
func (c *Credentials) Generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.check(false)
	return c.gen
}

// Authorization implements authn.Authenticator.
func (c *Credentials) Authorization() (*authn.AuthConfig, error) {
	return c.AuthorizationContext(context.Background())
}

// AuthorizationContext implements authn.ContextAuthenticator: the file is checked for a change
// first (go-containerregistry asks before every token fetch). A credential helper's answer is
// reused for CredentialsRecheck; a helper's run ends with ctx or after HelperTimeout. An entry
// that is gone yields anonymous access.
//
// Errors: a credential helper failed or did not answer in time (the error names the helper and
// the key, never what the helper printed).
func (c *Credentials) AuthorizationContext(ctx context.Context) (*authn.AuthConfig, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.check(true)
	if c.resolved != nil && c.resGen == c.gen && c.now().Sub(c.resAt) < CredentialsRecheck {
		out := *c.resolved
		return &out, nil
	}
	auth, err := c.lookup(ctx, c.cf)
	if err != nil {
		return nil, err
	}
	c.resolved, c.resGen, c.resAt = auth, c.gen, c.now()
	out := *auth
	return &out, nil
}

// check re-reads the file when force or CredentialsRecheck passed, and its stamp changed.
// c.mu is held.
func (c *Credentials) check(force bool) {
	now := c.now()
	if !force && now.Sub(c.statAt) < CredentialsRecheck {
		return
	}
	c.statAt = now
	st, err := filestamp.Of(c.path)
	if err == nil && st == c.stamp && !c.failing {
		return
	}
	st, cf, err := c.read()
	if err != nil {
		if !c.failing {
			c.log.Error().Str("upstream", c.registry).Str("file", c.path).Err(err).
				Msg("cannot re-read the upstream credentials file; keeping the credentials read before")
		}
		c.failing = true
		return
	}
	c.failing = false
	if st == c.stamp {
		return
	}
	c.stamp, c.cf = st, cf
	c.gen++
	c.log.Info().Str("upstream", c.registry).Str("file", c.path).Msg("upstream credentials file changed; read again")
}

// read stats and parses the file. The stamp is taken before the read, so a change during the
// read is seen at the next check.
func (c *Credentials) read() (filestamp.Stamp, *configfile.ConfigFile, error) {
	st, err := filestamp.Of(c.path)
	if err != nil {
		return filestamp.Stamp{}, nil, fmt.Errorf("credentials file: %w", err)
	}
	b, err := inputfile.Read(c.path, inputfile.DockerConfig)
	if err != nil {
		return filestamp.Stamp{}, nil, fmt.Errorf("credentials file: %w", err)
	}
	cf, err := config.LoadFromReader(bytes.NewReader(b))
	if err != nil {
		// encoding/json and base64 errors name types and offsets, never the content.
		return filestamp.Stamp{}, nil, fmt.Errorf("credentials file %s: not a docker config.json or .dockerconfigjson: %w", c.path, err)
	}
	if !cf.ContainsAuth() && !hasAuthKeys(b) {
		// An "auths" that is there but empty is no such case: the lookup then says the
		// registry has no entry, as for any other missing one.
		return filestamp.Stamp{}, nil, fmt.Errorf("credentials file %s: no \"auths\", \"credHelpers\" or \"credsStore\" in it", c.path)
	}
	return st, cf, nil
}

// hasAuthKeys reports whether the JSON object b has an "auths", "credHelpers" or "credsStore"
// key, empty or not.
func hasAuthKeys(b []byte) bool {
	var keys map[string]json.RawMessage
	if json.Unmarshal(b, &keys) != nil {
		return false
	}
	for _, k := range []string{"auths", "credHelpers", "credsStore"} {
		if _, ok := keys[k]; ok {
			return true
		}
	}
	return false
}

// lookup resolves the registry's entry in cf as docker does: from the credential helper
// configured for it (credHelpers, else credsStore; fromHelper, bounded by ctx and
// HelperTimeout), else from auths.
func (c *Credentials) lookup(ctx context.Context, cf *configfile.ConfigFile) (*authn.AuthConfig, error) {
	helper := cf.CredentialsStore
	if h, ok := cf.CredentialHelpers[c.key]; ok {
		helper = h
	}
	if helper != "" {
		auth, err := fromHelper(ctx, helper, c.key)
		if err != nil {
			return nil, fmt.Errorf("credentials for %s from %s (key %q): credential helper %w", c.registry, c.path, c.key, err)
		}
		return auth, nil
	}
	ac, err := cf.GetAuthConfig(c.key)
	if err != nil {
		return nil, fmt.Errorf("credentials for %s from %s (key %q): %w", c.registry, c.path, c.key, err)
	}
	return toAuthn(ac), nil
}

func toAuthn(ac types.AuthConfig) *authn.AuthConfig {
	return &authn.AuthConfig{
		Username:      ac.Username,
		Password:      ac.Password,
		IdentityToken: ac.IdentityToken,
		RegistryToken: ac.RegistryToken,
	}
}
