package warm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// ErrMirrorNotReady is returned when the mirror did not answer GET /v2/ within the wait.
var ErrMirrorNotReady = errors.New("mirror not ready")

// waitForMirror probes GET <mirror>/v2/ until it answers 200 or 401 (a registry that wants
// credentials is still up), by wall clock: the first probe at once, then one every interval
// until wait has passed. Each probe is bounded by probeTimeout (and by what is left of wait, but
// at least minProbe), so a mirror that accepts connections and never answers is a failed probe,
// not a hang. wait < 0 means a single probe. It returns the time waited, or an error wrapping
// ErrMirrorNotReady that names the seconds waited and the last failure.
func (c *client) waitForMirror(ctx context.Context, wait, probeTimeout, interval time.Duration) (time.Duration, error) {
	const minProbe = 500 * time.Millisecond
	start := time.Now()
	deadline := start.Add(max(wait, 0))
	target := c.base.JoinPath("/v2/").String()
	var (
		last   error
		probes int
	)
	for {
		timeout := probeTimeout
		if left := time.Until(deadline); left < timeout {
			timeout = max(left, minProbe)
		}
		probes++
		if last = c.probe(ctx, target, timeout); last == nil {
			return time.Since(start), nil
		}
		c.log.Debug().Err(last).Int("probe", probes).Msg("mirror not ready yet")
		left := time.Until(deadline)
		if wait < 0 || left <= 0 || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(min(interval, left))
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
	}
	waited := time.Since(start)
	if ctx.Err() != nil {
		last = fmt.Errorf("%w (%w)", last, context.Cause(ctx))
	}
	return waited, fmt.Errorf("%w: %s gave no registry answer to GET /v2/ in %s (%s; last: %w)",
		ErrMirrorNotReady, c.base, clitext.Span(waited), clitext.Count(probes, "probe"), last)
}

// probe sends one GET /v2/ bounded by timeout.
func (c *client) probe(ctx context.Context, target string, timeout time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := c.newRequest(pctx, target)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if pctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("no answer within %s: %w", clitext.Span(timeout), err)
		}
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK, http.StatusUnauthorized:
		c.mirrorVersion = resp.Header.Get(mirrorapi.HeaderVersion)
		return nil
	}
	return fmt.Errorf("GET %s answered %d %s, want 200 or 401", target, resp.StatusCode, http.StatusText(resp.StatusCode))
}
