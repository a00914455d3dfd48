package bootstrap

import "github.com/nodecache/nodecache/pkg/refusal"

// ErrRefused is refusal.ErrRefused, kept for callers that test errors.Is(err,
// bootstrap.ErrRefused). Every refusal of this package and its subpackages — a config file gen
// must not touch, a flag combination that cannot work, a host file of the wrong type or size —
// is a *refusal.Error, and nothing was changed. The CLI exits 2 for it.
var ErrRefused = refusal.ErrRefused
