package bootstrap_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/bootstrap"
)

func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestReadMirrorCA(t *testing.T) {
	t.Parallel()
	ca := selfSignedPEM(t)
	root := hostTree(t, map[string]string{"/etc/pki/ca.pem": string(ca), "/etc/pki/empty.pem": "", "/etc/pki/dir/x": ""},
		map[string]string{"/etc/ssl/mirror.pem": "/etc/pki/ca.pem", "/etc/ssl/gone.pem": "/etc/pki/gone.pem"})
	fsys := bootstrap.HostFS(root)
	got, err := bootstrap.ReadMirrorCA(fsys, root, "/etc/ssl/mirror.pem")
	if err != nil || !bytes.Equal(got, ca) {
		t.Fatalf("through an absolute link: %v", err)
	}
	for _, tc := range []struct{ p, want string }{
		{"/etc/pki/missing.pem", filepath.Join(root, "etc/pki/missing.pem") + " does not exist (a host path: read under --host-root " + root + ")"},
		{"/etc/pki/dir", filepath.Join(root, "etc/pki/dir") + " is a directory"},
		{"/etc/pki/empty.pem", filepath.Join(root, "etc/pki/empty.pem") + " holds no PEM certificate"},
		{"etc/pki/ca.pem", "want an absolute path"},
		{"/etc/ssl/gone.pem", "/etc/ssl/gone.pem is a symbolic link to /etc/pki/gone.pem, which does not exist"},
	} {
		_, err := bootstrap.ReadMirrorCA(fsys, root, tc.p)
		if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "<nil>") {
			t.Errorf("ReadMirrorCA(%s) = %v, want a refusal containing %q", tc.p, err, tc.want)
		}
	}
}
