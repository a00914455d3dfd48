package mirror

import (
	"context"

	"github.com/nodecache/nodecache/pkg/bundle"
)

// OnFillJoined makes every blob GET that joins a fill in flight call fn before it reads the
// fill: a test ends the fill there, or learns that the request joined it. Set it before the
// first request.
func (m *Mirror) OnFillJoined(fn func()) { m.fillJoined = fn }

// SetOpenBundle replaces how m opens its Options.Seed bundle (bundle.Open): a test holds the seed
// back with it, to see serve while it seeds.
func SetOpenBundle(m *Mirror, open func(ctx context.Context, dir string, opts bundle.ReadOptions) (*bundle.Reader, error)) {
	m.openBundle = open
}
