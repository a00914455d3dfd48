package bootstrap

import (
	"io/fs"
	"testing/fstest"
	"time"
)

// Overlay is an fs.FS that shows planned file contents over a base FS: a name in Files reads as
// those bytes (mode 0644, modification time now); nil bytes hide the file. Planners use it to
// re-read a configuration as it will be after their edits, before writing anything.
type Overlay struct {
	Base  fs.FS
	Files map[string][]byte // keyed by host path ("/etc/containerd/config.toml")
}

// Open implements fs.FS.
func (o Overlay) Open(name string) (fs.File, error) {
	for p, data := range o.Files {
		if FSName(p) != name {
			continue
		}
		if data == nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		m := fstest.MapFS{name: &fstest.MapFile{Data: data, Mode: 0o644, ModTime: time.Now()}}
		return m.Open(name)
	}
	return o.Base.Open(name)
}
