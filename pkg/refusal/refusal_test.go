package refusal_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/nodecache/nodecache/pkg/refusal"
)

// TestMessages: the message is Source and Reason joined by a space, or Reason alone; every
// constructor's error matches ErrRefused, wrapped or not, and a cause stays reachable.
func TestMessages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"reason only", refusal.Errorf("--mirror-ca %q: want an absolute path", "ca.pem"), `--mirror-ca "ca.pem": want an absolute path`},
		{"source and reason", &refusal.Error{Source: "/etc/containerd/config.toml", Reason: "is a directory; want a file"}, "/etc/containerd/config.toml is a directory; want a file"},
		{"value", refusal.Value("--platform", "linux/\n", "want os/arch"), `--platform "linux/\n" refused: want os/arch`},
		{"empty value", refusal.Value("--mirror", "", "required"), `--mirror "" refused: required`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("message %q, want %q", got, tc.want)
			}
			if !errors.Is(tc.err, refusal.ErrRefused) || !errors.Is(fmt.Errorf("gen: %w", tc.err), refusal.ErrRefused) {
				t.Errorf("%v does not match ErrRefused", tc.err)
			}
		})
	}
	cause := &refusal.Error{Reason: "cannot read it", Err: fs.ErrPermission}
	if !errors.Is(cause, fs.ErrPermission) || cause.Error() != "cannot read it" {
		t.Errorf("cause not reachable, or shown: %v", cause)
	}
	if errors.Is(errors.New("input refused"), refusal.ErrRefused) {
		t.Error("another error with the same text matches ErrRefused")
	}
}
