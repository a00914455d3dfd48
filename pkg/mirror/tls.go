package mirror

import (
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/internal/inputfile"
)

// CertificateRecheck is how often, at most, the listener's certificate and key files are
// stat'ed for a change (at a TLS handshake).
const CertificateRecheck = 10 * time.Second

// Certificate is the registry listener's TLS certificate (--tls-cert, --tls-key: PEM files,
// the certificate file may carry the chain), read again when what either path resolves to —
// (device, inode, size, mtime), symbolic links followed — changed, so a renewed certificate
// (cert-manager Secret, a Kubernetes `..data` symlink swap) is served without a restart. A pair
// that does not load any more keeps the one loaded before, and logs why. Safe for concurrent use.
type Certificate struct {
	certFile, keyFile string
	log               zerolog.Logger
	now               func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	stamps  [2]filestamp.Stamp
	checked time.Time
	failing bool
}

// LoadCertificate loads the PEM certificate (chain) in certFile and its private key in keyFile.
// log receives reloads and reload failures.
//
// Errors, each naming the flag and the file it is about: either file cannot be read or is not a
// regular file of at most inputfile.PEM.Limit bytes (refused: refusal.ErrRefused), or they are not a
// matching PEM certificate and key.
func LoadCertificate(certFile, keyFile string, log zerolog.Logger) (*Certificate, error) {
	c := &Certificate{certFile: certFile, keyFile: keyFile, log: log, now: time.Now}
	cert, stamps, err := c.load()
	if err != nil {
		return nil, err
	}
	c.cert, c.stamps, c.checked = cert, stamps, c.now()
	return c, nil
}

func (c *Certificate) load() (*tls.Certificate, [2]filestamp.Stamp, error) {
	var stamps [2]filestamp.Stamp
	files := []string{c.certFile, c.keyFile}
	// what names each file in an error: a bad key file is the key, not "the certificate".
	what := [2]string{"--tls-cert: TLS certificate", "--tls-key: TLS private key"}
	for i, f := range files {
		st, err := filestamp.Of(f)
		if err != nil {
			return nil, stamps, fmt.Errorf("%s: %w", what[i], err)
		}
		stamps[i] = st
	}
	var pem [2][]byte
	for i, f := range files {
		b, err := inputfile.Read(f, inputfile.PEM)
		if err != nil {
			return nil, stamps, fmt.Errorf("%s: %w", what[i], err)
		}
		pem[i] = b
	}
	cert, err := tls.X509KeyPair(pem[0], pem[1])
	if err != nil {
		return nil, stamps, fmt.Errorf("--tls-cert/--tls-key: TLS certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	return &cert, stamps, nil
}

// GetCertificate is tls.Config.GetCertificate: the current certificate, after checking the
// files for a change when CertificateRecheck passed since the last check.
func (c *Certificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); now.Sub(c.checked) >= CertificateRecheck {
		c.checked = now
		c.reload()
	}
	return c.cert, nil
}

// reload loads the pair again when a stamp changed; c.mu is held.
func (c *Certificate) reload() {
	var cur [2]filestamp.Stamp
	for i, f := range []string{c.certFile, c.keyFile} {
		cur[i], _ = filestamp.Of(f)
	}
	if cur == c.stamps && !c.failing {
		return
	}
	cert, stamps, err := c.load()
	if err != nil {
		if !c.failing {
			c.log.Error().Err(err).Msg("cannot reload the TLS certificate; serving the one loaded before")
		}
		c.failing = true
		return
	}
	c.failing = false
	if stamps == c.stamps {
		return
	}
	c.cert, c.stamps = cert, stamps
	c.log.Info().Str("cert", c.certFile).Str("key", c.keyFile).Msg("TLS certificate changed; loaded again")
}

// TLSConfig is the listener's configuration: TLS 1.2 or later, this certificate.
func (c *Certificate) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.GetCertificate}
}
