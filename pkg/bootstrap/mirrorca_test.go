package bootstrap_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
)

func TestReadMirrorCA(t *testing.T) {
	t.Parallel()
	ca := bootstraptest.CA(t)
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
