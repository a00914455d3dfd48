package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
)

// FailureReason names each kind of failure as the docs list it, and refuses to count what is
// not the upstream's failure (issue 25).
func TestFailureReason(t *testing.T) {
	t.Parallel()
	dnsErr := &net.DNSError{Err: "no such host", Name: "cdn.test", IsNotFound: true}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	urlErr := func(err error) error { return &url.Error{Op: "Get", URL: "https://up.test/v2/", Err: err} }
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"success", nil, ""},
		{"404", &Error{Status: http.StatusNotFound}, ""},
		{"busy", &Error{Status: http.StatusTooManyRequests, Err: ErrUpstreamBusy}, ""},
		{"schema 1", fmt.Errorf("x: %w", ErrSchema1), ""},
		{"abandoned", fmt.Errorf("fill abandoned: %w", context.Canceled), ""},
		{"staging file", fmt.Errorf("write staging file: %w", localError{errors.New("EIO")}), ""},
		{"401", &Error{Status: http.StatusUnauthorized}, FailHTTP401},
		{"403", &Error{Status: http.StatusForbidden}, FailHTTP403},
		{"429", &Error{Status: http.StatusTooManyRequests}, FailHTTP429},
		{"502", &Error{Status: http.StatusBadGateway}, FailHTTP5xx},
		{"508", &Error{Status: http.StatusLoopDetected}, FailOther},
		{"405", &Error{Status: http.StatusMethodNotAllowed}, FailOther},
		{"dns", &Error{Err: urlErr(dnsErr)}, FailDNS},
		{"connect", &Error{Err: urlErr(refused)}, FailConnect},
		{"tls", &Error{Err: urlErr(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})}, FailTLS},
		{"timeout", &Error{Err: urlErr(context.DeadlineExceeded)}, FailTimeout},
		{"stall", fmt.Errorf("upstream stream %w for 3s at byte 7: %w", errStalled, context.Canceled), FailTimeout},
		{"redirect dns", &Error{Err: urlErr(&redirectError{host: "cdn.test:443", err: dnsErr})}, FailRedirectHost},
		{"redirect refused by the guard", &Error{Err: urlErr(&redirectError{host: "cdn.test:443", err: &TargetRefusedError{Reason: ReasonLoopback}})}, FailRefusedTarget},
		{"digest", fmt.Errorf("x: %w", ErrDigestMismatch), FailDigestMismatch},
		{"manifest too large", fmt.Errorf("x: %w", ErrManifestTooLarge), FailTooLarge},
		{"unknown size too large", fmt.Errorf("x: %w", ErrUnknownSizeTooLarge), FailTooLarge},
		{"tag list too large", fmt.Errorf("x: %w", ErrTagListTooLarge), FailTooLarge},
		{"referrers list too large", fmt.Errorf("x: %w", ErrReferrersTooLarge), FailTooLarge},
		{"not a manifest", fmt.Errorf("x: %w", ErrNotManifest), FailNotManifest},
		{"short body", fmt.Errorf("x: %w", ErrShortBody), FailShortBody},
		{"bad range", fmt.Errorf("x: %w", ErrBadRange), FailBadRange},
		{"undecodable", errors.New("decode tags: invalid character"), FailOther},
	} {
		if got := FailureReason(c.err); got != c.want {
			t.Errorf("%s: %v is %q, want %q", c.name, c.err, got, c.want)
		}
	}
}

// ParseRateLimit takes exactly "N;w=SECONDS".
func TestParseRateLimit(t *testing.T) {
	t.Parallel()
	if n, w, ok := ParseRateLimit("76;w=21600"); !ok || n != 76 || w != 21600 {
		t.Errorf("76;w=21600: %d %d %v", n, w, ok)
	}
	if n, _, ok := ParseRateLimit("0;w=21600"); !ok || n != 0 {
		t.Errorf("0;w=21600: %d %v", n, ok)
	}
	for _, bad := range []string{"", "76", "76;", "76;w=", "76; w=21600", " 76;w=21600", "+76;w=21600", "-1;w=21600", "76;w=0",
		"76;w=21600;comment", "76;W=21600", "76,w=21600", "7 6;w=21600", "1234567890123456789;w=1", "x;w=1"} {
		if _, _, ok := ParseRateLimit(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
