// Package filestamp tells whether a file changed: the identity (device, inode) and the size and
// modification time of what a path resolves to, symbolic links followed. A Kubernetes Secret or
// ConfigMap volume swaps its `..data` symlink atomically to a new directory, so a changed stamp
// shows the swap even when size and mtime happen to be equal.
package filestamp

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

// Stamp is what a path resolved to when it was stat'ed. The zero Stamp matches no file.
type Stamp struct {
	Dev, Ino uint64
	Size     int64
	Mtime    time.Time
}

// Of stats path (following symbolic links).
//
// Errors: the *fs.PathError of os.Stat, or one saying the platform gives no device and inode.
func Of(path string) (Stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Stamp{}, err
	}
	s, ok := FromInfo(fi)
	if !ok {
		return Stamp{}, fmt.Errorf("stat %s: no device and inode on this platform", path)
	}
	return s, nil
}

// Equal reports whether s and o are the same file unchanged; the zero Stamp equals none.
func (s Stamp) Equal(o Stamp) bool {
	return s.Ino != 0 && s.Dev == o.Dev && s.Ino == o.Ino && s.Size == o.Size && s.Mtime.Equal(o.Mtime)
}

// FromInfo is the stamp of an open file's os.FileInfo (from (*os.File).Stat); ok is false when
// the platform gives no device and inode.
func FromInfo(fi os.FileInfo) (s Stamp, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return Stamp{}, false
	}
	return Stamp{Dev: uint64(st.Dev), Ino: st.Ino, Size: fi.Size(), Mtime: fi.ModTime()}, true //nolint:unconvert // Dev is int32 or uint64 by platform
}
