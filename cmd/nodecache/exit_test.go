package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// TestExitCode: exitCode is the one place refused input becomes exit 2, wrapped or joined as
// the packages return it; a code a command chose (withCode, silentExit) wins.
func TestExitCode(t *testing.T) {
	t.Parallel()
	refused := refusal.Errorf("--mirror-ca %q: want an absolute path", "ca.pem")
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"refusal", refused, exitUsage},
		{"wrapped refusal", fmt.Errorf("apply /etc/containerd/config.toml: %w", refused), exitUsage},
		{"joined refusal", errors.Join(errors.New("other"), refused), exitUsage},
		{"root in use", fmt.Errorf("--root /var/lib/nodecache: %w by pid 7", mirror.ErrRootInUse), exitUsage},
		{"failure", errors.New("mirror not ready"), exitNegative},
		{"chosen code wins", withCode(exitUnknown, refused), exitUnknown},
		{"silent", silentExit(exitNegative), exitNegative},
		{"usage", usagef("unknown command %q", "sevre"), exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := exitCode(tc.err); got != tc.want {
				t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}
