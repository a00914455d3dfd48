package upstreamauth

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/docker/docker-credential-helpers/client"
	"github.com/docker/docker-credential-helpers/credentials"
	"github.com/google/go-containerregistry/pkg/authn"
)

// HelperTimeout bounds one run of a credential helper (`docker-credential-<name> get`): one that
// has not answered by then is killed and the lookup fails. Helpers that call a cloud API (ECR,
// GCR) answer in seconds.
const HelperTimeout = 30 * time.Second

// tokenUsername is the username by which a credential helper hands out an identity token
// instead of a password (docker/cli credentials.nativeStore).
const tokenUsername = "<token>"

// fromHelper asks credential helper name for key, as docker/cli's native store does
// (docker-credential-helpers' client protocol: `get`, the server on standard input, JSON on
// standard output), but bounded by ctx and HelperTimeout, the process killed when they end. An
// entry the helper does not have is anonymous access, as in docker.
//
// Errors: the helper failed, was not found, or did not answer in time. They never carry what
// the helper printed (a failing helper may have printed a secret), only its known "not found"
// answer.
func fromHelper(ctx context.Context, name, key string) (*authn.AuthConfig, error) {
	ctx, cancel := context.WithTimeout(ctx, HelperTimeout)
	defer cancel()
	program := "docker-credential-" + name
	var run *helperRun
	creds, err := client.Get(func(args ...string) client.Program {
		run = &helperRun{cmd: exec.CommandContext(ctx, program, args...)}
		return run
	}, key)
	switch {
	case credentials.IsErrCredentialsNotFound(err):
		return &authn.AuthConfig{}, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("%s get: no answer (stopped after %s, or when the run ended)", program, HelperTimeout)
	case err != nil && run != nil && run.err != nil:
		return nil, run.err // client.Get's own error would quote the output
	case err != nil:
		return nil, fmt.Errorf("%s get: its answer is not the helpers' JSON: %w", program, err)
	}
	if creds.Username == tokenUsername {
		return &authn.AuthConfig{IdentityToken: creds.Secret}, nil
	}
	return &authn.AuthConfig{Username: creds.Username, Password: creds.Secret}, nil
}

// helperRun is one run of a credential helper for client.Get.
type helperRun struct {
	cmd *exec.Cmd
	err error // the failure, without the output
}

// Input sets what the helper reads.
func (h *helperRun) Input(in io.Reader) { h.cmd.Stdin = in }

// Output runs the helper. On a failure it returns only the helpers' "not found" answer, which
// client.Get recognises, and otherwise no output at all: client.Get would put it in its error.
func (h *helperRun) Output() ([]byte, error) {
	out, err := h.cmd.Output()
	if err == nil {
		return out, nil
	}
	if credentials.IsErrCredentialsNotFoundMessage(string(out)) {
		return out, err
	}
	h.err = &helperError{program: h.cmd.Args[0], err: err}
	return nil, h.err
}

// helperError is a failed run of a credential helper, without what it printed.
type helperError struct {
	program string
	err     error
}

func (e *helperError) Error() string {
	return fmt.Sprintf("%s get: %v (what it printed is not shown: it may hold a secret)", e.program, e.err)
}

func (e *helperError) Unwrap() error { return e.err }
