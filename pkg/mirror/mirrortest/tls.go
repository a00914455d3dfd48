package mirrortest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a throw-away certificate authority for TLS tests.
type CA struct {
	// PEM is the CA certificate, PEM-encoded (what --mirror-ca and --upstream-ca read).
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA creates a CA valid for a day.
func NewCA(t testing.TB) *CA {
	t.Helper()
	der, key := newCertificate(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "nodecache test CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}
}

// newCertificate creates a certificate from tmpl, valid for a day with a random serial number, for
// a new P-256 key, signed by parent with parentKey (self-signed when parent is nil); it returns
// the certificate (DER) and the key.
func newCertificate(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64)); err != nil {
		t.Fatal(err)
	}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

// Issue returns a server certificate and its key (PEM) for hosts (DNS names or IP addresses).
func (ca *CA) Issue(t testing.TB, hosts ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, key := newCertificate(t, tmpl, ca.cert, ca.key)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// WriteFiles writes a server certificate for hosts to dir/<prefix>.crt and dir/<prefix>.key, and
// the CA to dir/ca.crt; it returns the three paths.
func (ca *CA) WriteFiles(t testing.TB, dir, prefix string, hosts ...string) (certFile, keyFile, caFile string) {
	t.Helper()
	c, k := ca.Issue(t, hosts...)
	certFile, keyFile, caFile = filepath.Join(dir, prefix+".crt"), filepath.Join(dir, prefix+".key"), filepath.Join(dir, "ca.crt")
	for f, b := range map[string][]byte{certFile: c, keyFile: k, caFile: ca.PEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile, caFile
}

// TLSConfig is a server configuration with a certificate for hosts.
func (ca *CA) TLSConfig(t testing.TB, hosts ...string) *tls.Config {
	t.Helper()
	c, k := ca.Issue(t, hosts...)
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// Pool is a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}
