package warm

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestRetrySchedule drives client.retry in a synctest bubble (fake clock): how many attempts run,
// how long the waits are (the exponential schedule capped by maxDelay, a Retry-After honoured and
// capped) and which error comes back.
func TestRetrySchedule(t *testing.T) {
	t.Parallel()
	errNet := errors.New("connection reset")
	status := func(code int, retryAfter time.Duration) error {
		return &statusError{URL: "http://m/v2/x", Status: code, RetryAfter: retryAfter}
	}
	tests := []struct {
		name         string
		retries      int
		errs         []error // attempt n returns errs[n] (nil: success); past the end, the last one
		wantAttempts int
		wantErr      error // matched with errors.Is; nil means success
		minWait      time.Duration
		maxWait      time.Duration
	}{
		{name: "success first", retries: 3, errs: []error{nil}, wantAttempts: 1},
		{name: "network errors then success", retries: 3, errs: []error{errNet, errNet, nil}, wantAttempts: 3,
			// two waits drawn from [50ms, 150ms] and [100ms, 300ms]
			minWait: 150 * time.Millisecond, maxWait: 450 * time.Millisecond},
		{name: "retries exhausted", retries: 2, errs: []error{errNet}, wantAttempts: 3, wantErr: errNet,
			minWait: 150 * time.Millisecond, maxWait: 450 * time.Millisecond},
		{name: "no retries", retries: 0, errs: []error{errNet}, wantAttempts: 1, wantErr: errNet},
		{name: "negative retries", retries: -1, errs: []error{errNet}, wantAttempts: 1, wantErr: errNet},
		{name: "permanent", retries: 5, errs: []error{permanent(errNet)}, wantAttempts: 1, wantErr: errNet},
		{name: "404 not retried", retries: 5, errs: []error{status(http.StatusNotFound, 0)}, wantAttempts: 1},
		{name: "a nodecache's 502 for a wrong answer not retried", retries: 5,
			errs: []error{&statusError{URL: "http://m/v2/x", Status: http.StatusBadGateway, WrongAnswer: true}}, wantAttempts: 1},
		{name: "another 502 retried", retries: 1, errs: []error{status(http.StatusBadGateway, 0), nil}, wantAttempts: 2,
			minWait: 50 * time.Millisecond, maxWait: 150 * time.Millisecond},
		{name: "429 Retry-After honoured", retries: 1, errs: []error{status(http.StatusTooManyRequests, 700*time.Millisecond), nil}, wantAttempts: 2,
			minWait: 700 * time.Millisecond, maxWait: 700 * time.Millisecond},
		{name: "Retry-After capped by maxDelay", retries: 1, errs: []error{status(http.StatusServiceUnavailable, time.Hour), nil}, wantAttempts: 2,
			minWait: time.Second, maxWait: time.Second},
		{name: "waits capped by maxDelay", retries: 6, errs: []error{errNet, errNet, errNet, errNet, errNet, errNet, nil}, wantAttempts: 7,
			// 100ms doubling: 5 waits under the cap, the sixth at most 1s
			minWait: 50*time.Millisecond + 100*time.Millisecond + 200*time.Millisecond + 400*time.Millisecond + 500*time.Millisecond + 500*time.Millisecond,
			maxWait: 6 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c := &client{retries: tc.retries, backoff: 100 * time.Millisecond, maxDelay: time.Second, log: zerolog.Nop()}
				var attempts []int
				start := time.Now()
				err := c.retry(t.Context(), "test", func(_ context.Context, n int) error {
					attempts = append(attempts, n)
					return tc.errs[min(n, len(tc.errs)-1)]
				})
				waited := time.Since(start)
				if len(attempts) != tc.wantAttempts {
					t.Fatalf("attempts %v, want %d", attempts, tc.wantAttempts)
				}
				for i, n := range attempts {
					if n != i {
						t.Fatalf("attempt numbers %v", attempts)
					}
				}
				last := tc.errs[min(len(attempts)-1, len(tc.errs)-1)]
				switch {
				case last == nil && err != nil:
					t.Fatalf("err %v, want success", err)
				case last != nil && (err == nil || err.Error() != last.Error()):
					t.Fatalf("err %v, want the last attempt's %v", err, last)
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v is not %v", err, tc.wantErr)
				}
				if waited < tc.minWait || waited > tc.maxWait {
					t.Fatalf("waited %s, want %s..%s", waited, tc.minWait, tc.maxWait)
				}
			})
		})
	}
}

// TestStatusErrorWrongAnswer: a 502 that names its OCI error code in mirrorapi.HeaderErrorCode
// (a nodecache saying the upstream's answer was wrong) is a wrong answer; a bare 502 (a proxy's)
// and a 503 are not.
func TestStatusErrorWrongAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		code   string
		want   bool
	}{{http.StatusBadGateway, "UNKNOWN", true}, {http.StatusBadGateway, "", false}, {http.StatusServiceUnavailable, "UNAVAILABLE", false}} {
		resp := &http.Response{StatusCode: tc.status, Header: http.Header{}, Body: http.NoBody,
			Request: &http.Request{URL: &url.URL{Scheme: "http", Host: "m", Path: "/v2/x"}}}
		if tc.code != "" {
			resp.Header.Set(mirrorapi.HeaderErrorCode, tc.code)
		}
		if got := newStatusError(resp).WrongAnswer; got != tc.want {
			t.Errorf("%d with error code %q: WrongAnswer %v, want %v", tc.status, tc.code, got, tc.want)
		}
	}
}

// TestRetryStoppedWhileWaiting: the context ends during a wait; the error names the last
// attempt's failure and the cause.
func TestRetryStoppedWhileWaiting(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		errNet := errors.New("connection reset")
		errStop := errors.New("deadline of the run")
		ctx, cancel := context.WithCancelCause(t.Context())
		c := &client{retries: 5, backoff: time.Second, maxDelay: time.Minute, log: zerolog.Nop()}
		go func() {
			time.Sleep(100 * time.Millisecond)
			cancel(errStop)
		}()
		attempts := 0
		err := c.retry(ctx, "test", func(context.Context, int) error { attempts++; return errNet })
		if attempts != 1 || !errors.Is(err, errNet) || !errors.Is(err, errStop) {
			t.Fatalf("attempts %d, err %v: want 1 attempt, an error wrapping both", attempts, err)
		}
		if want := "connection reset (stopped while waiting to retry: deadline of the run)"; err.Error() != want {
			t.Fatalf("err %q, want %q", err, want)
		}
	})
}
