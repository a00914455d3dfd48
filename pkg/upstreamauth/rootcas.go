package upstreamauth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"

	"github.com/nodecache/nodecache/internal/inputfile"
)

// LoadRootCAs returns the system's certificate authorities plus the PEM certificates in file
// (--upstream-ca).
//
// Errors: the file cannot be read, is not a regular file of at most inputfile.PEM.Limit bytes
// (refused: refusal.ErrRefused), or holds no PEM certificate.
func LoadRootCAs(file string) (*x509.CertPool, error) { return addRootCAs(nil, file) }

// addRootCAs is LoadRootCAs adding to pool (nil: a new one from the system's).
func addRootCAs(pool *x509.CertPool, file string) (*x509.CertPool, error) {
	b, err := inputfile.Read(file, inputfile.PEM)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	if pool == nil {
		if pool, err = x509.SystemCertPool(); err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate (want -----BEGIN CERTIFICATE-----)", file)
	}
	return pool, nil
}

// WithRootCAs returns base trusting pool for TLS (a clone; base is unchanged), or base itself
// when pool is nil.
//
// Errors: base is not an *http.Transport (only its TLS configuration can carry a pool).
func WithRootCAs(base http.RoundTripper, pool *x509.CertPool) (http.RoundTripper, error) {
	if pool == nil {
		return base, nil
	}
	t, ok := base.(*http.Transport)
	if !ok {
		return nil, fmt.Errorf("a private CA needs an *http.Transport, not %T", base)
	}
	t = t.Clone()
	if t.TLSClientConfig == nil {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	t.TLSClientConfig.RootCAs = pool
	return t, nil
}
