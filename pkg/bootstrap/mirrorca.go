package bootstrap

import (
	"crypto/x509"
	"errors"
	"io/fs"
	"path"
	"path/filepath"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// ReadMirrorCA reads --mirror-ca: the PEM CA certificate file at host path p (absolute) on the
// host seen through fsys, rooted at the host root, symbolic links followed as the host follows
// them (Resolving). hostRoot is where that root lies on this machine (--host-root; "" when not
// known) and only serves to name, in messages, the file that was really looked at. Every failure
// is a refusal (ErrRefused) naming p, the path read and what is wrong: not absolute, missing, a
// directory, unreadable, or no PEM certificate in it.
func ReadMirrorCA(fsys fs.FS, hostRoot, p string) ([]byte, error) {
	under := ""
	if hostRoot != "" {
		under = " (a host path: read under --host-root " + hostRoot + ")"
	}
	if !path.IsAbs(p) {
		return nil, refusal.Errorf("--mirror-ca %q: want an absolute path%s", p, under)
	}
	fsys = Resolving(fsys)
	real, err := Resolve(fsys, p)
	if err != nil {
		return nil, refusal.Errorf("--mirror-ca %s: %v", p, err)
	}
	at := real
	if hostRoot != "" {
		at = filepath.Join(hostRoot, FSName(real))
	}
	if real != path.Clean(p) {
		at += " (where the symbolic link " + p + " leads)"
	}
	fi, err := fs.Stat(fsys, FSName(real))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, refusal.Errorf("--mirror-ca %s: %s does not exist%s", p, at, under)
	case err != nil:
		return nil, refusal.Errorf("--mirror-ca %s: cannot read %s: %v", p, at, pathErrCause(err))
	case fi.IsDir():
		return nil, refusal.Errorf("--mirror-ca %s: %s is a directory; want a PEM CA certificate file", p, at)
	}
	data, err := inputfile.ReadFS(fsys, FSName(real), "--mirror-ca "+p+": "+at, inputfile.PEM)
	if inputfile.Refused(err) {
		return nil, err
	}
	if err != nil {
		return nil, refusal.Errorf("--mirror-ca %s: cannot read %s: %v", p, at, pathErrCause(err))
	}
	if !x509.NewCertPool().AppendCertsFromPEM(data) {
		return nil, refusal.Errorf("--mirror-ca %s: %s holds no PEM certificate (want -----BEGIN CERTIFICATE-----)", p, at)
	}
	return data, nil
}

// pathErrCause drops the *fs.PathError wrapping (op and fs-relative name) that would repeat the
// path a message already names.
func pathErrCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
