package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Applier performs planned changes under a host root.
type Applier struct {
	// Root is the --host-root prefix every host path is joined to. Empty means "/".
	Root string
	// Logger receives one line per file written, removed or restored. Default: disabled
	// (the zero Logger writes nothing).
	Logger zerolog.Logger
	// Reported means the caller prints every change itself (gen's report lines): the lines
	// above are then logged at debug level instead of info, so that a change is told once.
	Reported bool
}

// event starts the log line of a change: info, or debug when the caller reports the changes.
func (a Applier) event() *zerolog.Event {
	if a.Reported {
		return a.Logger.Debug()
	}
	return a.Logger.Info()
}

// HostPath joins a host path to the root.
func (a Applier) HostPath(p string) string {
	root := a.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, FSName(p))
}

// Apply checks that every file still holds the bytes the plan saw (refusing with an error that
// wraps ErrStale and writing nothing otherwise), then performs the changes in order. Writes are
// atomic (temp file in the same directory, fsync, rename, fsync of the directory); an update of a
// user's file first saves its original at Change.Backup unless that backup already exists.
// Unchanged entries are skipped. An error part way names the file it failed on and the changes
// applied before it, which stay applied (there is no rollback).
func (a Applier) Apply(ctx context.Context, changes []Change) error {
	for _, c := range changes {
		if err := a.check(c); err != nil {
			return err
		}
	}
	var done []string // what was applied already, named when a later change fails
	for _, c := range changes {
		err := ctx.Err()
		if err != nil {
			err = fmt.Errorf("apply %s: %w", c.Path, err)
		} else {
			err = a.apply(c)
		}
		if err != nil {
			if len(done) > 0 {
				return fmt.Errorf("%w; already done before it, and left in place (no rollback): %s (run again once the cause is fixed, or with --remove to undo)", err, strings.Join(done, ", "))
			}
			return err
		}
		if c.Changed() {
			done = append(done, string(c.Action)+" "+c.Path)
		}
	}
	return nil
}

// ErrStale means a file changed between planning and applying.
var ErrStale = errors.New("file changed since it was read; run again")

// check verifies, just before anything is written, that c can be applied as planned: no
// symbolic link in its paths, the file still holding c.Old, a restore's backup a regular file.
//
// Host writes never follow a link they did not expect. A backup that is a symbolic link is
// refused (ErrRefused, RefuseLinkedBackup, checked with Lstat), as planning refuses it; a link
// that appeared in a planned path since planning is ErrStale. What is left is the window between
// this check and the write: the writes are rename(2) and unlink(2) (WriteFileAtomic renames a
// temp file over the path; a restore renames the backup; a remove unlinks), which act on the
// final name itself and never follow a link there, so a backup swapped for a link in that window
// moves the link, not the file it leads to. A directory swapped for a link in that window would
// redirect the write, but only someone who can write that directory (root's /etc/containerd)
// can swap it, and they can write the config directly. github.com/cyphar/filepath-securejoin
// (runc, containerd) is not used: its SecureJoin resolves a path in a root and is itself a
// check-then-use (documented as racy), and its race-free handles (OpenInRoot, MkdirAllHandle)
// open files and create directories but neither rename nor remove, which are the writes here;
// os.Root's renames would close the window for directories but take an absolute link target
// as an escape, where the host's kernel (and Resolve) start it again at the host root.
func (a Applier) check(c Change) error {
	if !c.Changed() {
		return nil
	}
	root := a.Root
	if root == "" {
		root = "/"
	}
	if c.Backup != "" {
		if err := RefuseLinkedBackup(os.DirFS(root), c.Backup); err != nil {
			return fmt.Errorf("apply %s: %w", c.Path, err)
		}
	}
	// A planned path has no symbolic link in it (ResolveChanges); one that appeared since would
	// make the write replace the link or land elsewhere.
	for _, p := range []string{c.Path, c.Backup} {
		if p == "" {
			continue
		}
		real, err := Resolve(os.DirFS(root), p)
		if err != nil {
			return fmt.Errorf("apply %s: %w", c.Path, err)
		}
		if real != path.Clean("/"+p) {
			return fmt.Errorf("apply %s: %s leads through a symbolic link to %s: %w", c.Path, p, real, ErrStale)
		}
	}
	cur, err := inputfile.Read(a.HostPath(c.Path), inputfile.RuntimeConfig)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if c.Old != nil {
			return fmt.Errorf("apply %s: %w", c.Path, ErrStale)
		}
	case err != nil:
		return fmt.Errorf("apply %s: read: %w", c.Path, err)
	case c.Old == nil || !bytes.Equal(cur, c.Old):
		return fmt.Errorf("apply %s: %w", c.Path, ErrStale)
	}
	if c.Action == ActionRestore {
		fi, err := os.Lstat(a.HostPath(c.Backup))
		if err != nil {
			return fmt.Errorf("apply %s: backup %s: %w", c.Path, c.Backup, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("apply %s: %w", c.Path, refusal.Errorf("backup %s is %s, not the regular file nodecache wrote: it is not moved over %s; nothing was changed",
				c.Backup, inputfile.ModeWords(fi.Mode()), c.Path))
		}
	}
	return nil
}

func (a Applier) apply(c Change) error {
	target := a.HostPath(c.Path)
	switch c.Action {
	case ActionUnchanged:
		return nil
	case ActionCreate, ActionUpdate:
		return a.write(c, target)
	case ActionRemove:
		if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", c.Path, err)
		}
		if c.PruneDir {
			// Only an empty directory goes; anything else in it (a user's certificates) stays.
			_ = os.Remove(filepath.Dir(target))
		}
		a.event().Str("file", c.Path).Msg("file removed")
	case ActionRestore:
		if err := os.Rename(a.HostPath(c.Backup), target); err != nil {
			return fmt.Errorf("restore %s from %s: %w", c.Path, c.Backup, err)
		}
		if err := syncDir(filepath.Dir(target)); err != nil {
			return fmt.Errorf("restore %s: %w", c.Path, err)
		}
		a.event().Str("file", c.Path).Str("backup", c.Backup).Msg("file restored from backup")
	default:
		return fmt.Errorf("apply %s: unknown action %q", c.Path, c.Action)
	}
	return nil
}

// write applies a create or an update at target (c.Path on the host): the existing file's mode
// and owner are kept, and its old bytes are backed up first when c asks and no backup is there.
func (a Applier) write(c Change, target string) error {
	mode, uid, gid := c.Mode, -1, -1
	if fi, err := os.Stat(target); err == nil {
		mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	}
	if mode == 0 {
		mode = 0o644
	}
	if c.Backup != "" && c.Old != nil {
		bak := a.HostPath(c.Backup)
		if _, err := os.Lstat(bak); errors.Is(err, fs.ErrNotExist) {
			if err := WriteFileAtomic(bak, c.Old, mode, uid, gid); err != nil {
				return fmt.Errorf("back up %s to %s: %w", c.Path, c.Backup, err)
			}
			a.event().Str("file", c.Backup).Msg("backup written")
		} else if err != nil {
			return fmt.Errorf("back up %s: %w", c.Path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", c.Path, err)
	}
	if err := WriteFileAtomic(target, c.New, mode, uid, gid); err != nil {
		return fmt.Errorf("write %s: %w", c.Path, err)
	}
	a.event().Str("file", c.Path).Str("action", string(c.Action)).Msg("file written")
	return nil
}

// WriteFileAtomic replaces name with data: a temp file in the same directory, written, chmod'ed
// (and chown'ed to uid:gid when both are >= 0), fsync'ed, renamed over name, then the directory
// fsync'ed. A reader sees the old or the new bytes, never a partial file.
func WriteFileAtomic(name string, data []byte, mode fs.FileMode, uid, gid int) (err error) {
	dir := filepath.Dir(name)
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".nodecache-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if uid >= 0 && gid >= 0 {
		if err = f.Chown(uid, gid); err != nil && !errors.Is(err, fs.ErrPermission) {
			return err
		}
		err = nil
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, name); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
