package upstreamauth

import (
	"crypto/x509"
	"fmt"

	"github.com/nodecache/nodecache/internal/inputfile"
)

// LoadRootCAs returns the system's certificate authorities plus the PEM certificates in file
// (--upstream-ca).
//
// Errors: the file cannot be read, is not a regular file of at most inputfile.PEM.Limit bytes
// (refused: refusal.ErrRefused), or holds no PEM certificate.
func LoadRootCAs(file string) (*x509.CertPool, error) {
	b, err := inputfile.Read(file, inputfile.PEM)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate (want -----BEGIN CERTIFICATE-----)", file)
	}
	return pool, nil
}
