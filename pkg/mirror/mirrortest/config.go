package mirrortest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
)

// NewRegistryWithConfig starts a registry like NewRegistry whose configuration is adjusted by
// configure before the registry is built, e.g. to accept foreign layers whose URLs match
// cfg.Validation.Manifests.URLs.Allow (distribution refuses every layer URL by default).
func NewRegistryWithConfig(t testing.TB, configure func(*configuration.Configuration)) *Registry {
	t.Helper()
	r := NewStoppedRegistry(t, "127.0.0.1:0")
	r.handler = NewHandlerWithConfig(t, configure)
	r.Start(t)
	return r
}

// NewHandlerWithConfig is NewHandler with configure applied to the configuration first.
func NewHandlerWithConfig(t testing.TB, configure func(*configuration.Configuration)) http.Handler {
	t.Helper()
	QuietLogrus()
	cfg := &configuration.Configuration{}
	cfg.Storage = configuration.Storage{"inmemory": configuration.Parameters{}}
	cfg.Storage["delete"] = configuration.Parameters{"enabled": true}
	// The upload purger is a goroutine that never stops: off, so goleak can check the tests.
	cfg.Storage["maintenance"] = configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}}
	cfg.Log.Level = "error"
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	cfg.HTTP.RelativeURLs = true
	if configure != nil {
		configure(cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return handlers.NewApp(ctx, cfg)
}
