package upstreamauth

import (
	"crypto/x509"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestLoadRepeatedName: one upstream named by two --upstream-auth values is refused, naming both
// files (the last used to win silently); two --upstream-ca files of one upstream are trusted
// together (the last used to replace the first).
func TestLoadRepeatedName(t *testing.T) {
	t.Parallel()
	up, err := name.ParseUpstream("registry.test:5000=https://registry.test:5000")
	if err != nil {
		t.Fatal(err)
	}
	ups := []name.Upstream{up}
	dir := t.TempDir()
	a := filepath.Join(dir, "a.json")
	b := filepath.Join(dir, "b.json")
	writeFile(t, a, `{"auths":{"registry.test:5000":{"auth":"`+b64("a:one")+`"}}}`)
	writeFile(t, b, `{"auths":{"registry.test:5000":{"auth":"`+b64("b:two")+`"}}}`)
	_, _, err = Load([]string{"registry.test:5000=" + a, "registry.test:5000=" + b}, nil, ups, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "--upstream-auth registry.test:5000 is given twice ("+a+" and "+b+")") {
		t.Errorf("two --upstream-auth files for one upstream: %v, want refused naming both", err)
	}

	first, second := mirrortest.NewCA(t), mirrortest.NewCA(t)
	caA, caB := filepath.Join(dir, "a.pem"), filepath.Join(dir, "b.pem")
	writeFile(t, caA, string(first.PEM))
	writeFile(t, caB, string(second.PEM))
	_, cas, err := Load(nil, []string{"registry.test:5000=" + caA, "registry.test:5000=" + caB}, ups, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for i, ca := range []*mirrortest.CA{first, second} {
		certPEM, _ := ca.Issue(t, "registry.test")
		blk, _ := pem.Decode(certPEM)
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: cas["registry.test:5000"], DNSName: "registry.test"}); err != nil {
			t.Errorf("a certificate of --upstream-ca file %d is not trusted: %v", i+1, err)
		}
	}
}
