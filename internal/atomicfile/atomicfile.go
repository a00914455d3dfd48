// Package atomicfile writes whole files so that a reader, or the next start after a crash, sees
// the old content or the new, never part of it: the bytes go to a temporary file, are fsynced,
// and the file is renamed over the target (rename(2) replaces atomically within one filesystem).
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Options say where the temporary file goes and the modes of what Write creates.
type Options struct {
	// TempDir holds the temporary file; "" is the target's own directory (then the temporary
	// file is named ".<base>-*"). It must be on the target's filesystem.
	TempDir string
	// Perm is the written file's mode; 0 is 0o600.
	Perm fs.FileMode
	// DirPerm is the mode of the target's directories Write creates; 0 is 0o700.
	DirPerm fs.FileMode
	// SyncDir also fsyncs the target's directory after the rename, so the rename itself
	// survives a crash (what is answered only once it is on disk).
	SyncDir bool
}

// Write writes b to p: p's directory created (Options.DirPerm), a temporary file written,
// fsynced and renamed over p. The temporary file is removed on every error.
//
// Errors: "write <p>: …" wrapping the failed operation's error.
func Write(p string, b []byte, o Options) error {
	if o.Perm == 0 {
		o.Perm = 0o600
	}
	if o.DirPerm == 0 {
		o.DirPerm = 0o700
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, o.DirPerm); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	tempDir, pattern := o.TempDir, "file-*"
	if tempDir == "" {
		tempDir, pattern = dir, "."+filepath.Base(p)+"-*"
	}
	tmp, err := os.CreateTemp(tempDir, pattern)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename: nothing to remove then
	if err := writeSynced(tmp, b, o.Perm); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if !o.SyncDir {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write %s: sync its directory: %w", p, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write %s: sync its directory: %w", p, err)
	}
	return nil
}

// writeSynced writes b to f, fsyncs it, sets its mode and closes it.
func writeSynced(f *os.File, b []byte, perm fs.FileMode) error {
	_, err := f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
