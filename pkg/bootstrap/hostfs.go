package bootstrap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// MaxSymlinkHops bounds the symbolic links Resolve follows for one path: 40, the kernel's
// MAXSYMLINKS (Linux fs/namei.c), so a loop is refused where the kernel answers ELOOP.
const MaxSymlinkHops = 40

// HostFS returns an fs.FS over the host's file tree mounted at root (--host-root; "/" on the
// node itself) that follows symbolic links the way the host does: see Resolving. os.DirFS alone
// would follow an absolute link target on this machine's own / instead of under root.
func HostFS(root string) fs.FS {
	if root == "" {
		root = "/"
	}
	return Resolving(os.DirFS(root))
}

// Resolving wraps fsys (an fs.FS rooted at the host root that can read links, fs.ReadLinkFS, as
// os.DirFS can) so that every name is resolved with Resolve before it is opened: reads reach the
// file the host's runtime would read, never a file outside the host root. An fsys that cannot
// read links (a MapFS view, an Overlay) has no links to follow and is returned as it is, and so
// is an fsys already wrapped.
func Resolving(fsys fs.FS) fs.FS {
	if _, ok := fsys.(resolvingFS); ok {
		return fsys
	}
	rl, ok := fsys.(fs.ReadLinkFS)
	if !ok {
		return fsys
	}
	return resolvingFS{base: rl}
}

type resolvingFS struct {
	base fs.ReadLinkFS
}

var (
	_ fs.ReadLinkFS = resolvingFS{}
	_ fs.StatFS     = resolvingFS{}
)

// Open opens the file name leads to. A refusal of Resolve (a loop, a link to nothing) is
// returned as it is, so errors.Is(err, ErrRefused) holds.
func (r resolvingFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	real, err := Resolve(r.base, "/"+name)
	if err != nil {
		return nil, err
	}
	return r.base.Open(FSName(real))
}

// Stat describes the file name leads to without opening it (fs.StatFS): fs.Stat would
// otherwise open the file, and opening a FIFO blocks until a writer comes.
func (r resolvingFS) Stat(name string) (fs.FileInfo, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrInvalid}
	}
	real, err := Resolve(r.base, "/"+name)
	if err != nil {
		return nil, err
	}
	return fs.Stat(r.base, FSName(real))
}

// Lstat describes name itself (not what a link there points to), its directories resolved.
func (r resolvingFS) Lstat(name string) (fs.FileInfo, error) {
	dir, err := r.parent(name)
	if err != nil {
		return nil, err
	}
	return r.base.Lstat(FSName(path.Join(dir, path.Base("/"+name))))
}

// ReadLink returns the target of the link name, its directories resolved.
func (r resolvingFS) ReadLink(name string) (string, error) {
	dir, err := r.parent(name)
	if err != nil {
		return "", err
	}
	return r.base.ReadLink(FSName(path.Join(dir, path.Base("/"+name))))
}

func (r resolvingFS) parent(name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", &fs.PathError{Op: "lstat", Path: name, Err: fs.ErrInvalid}
	}
	return Resolve(r.base, path.Dir("/"+name))
}

// component is one name still to walk in Resolve; link and target are set when it came from a
// link's target, to name them when it is missing.
type component struct {
	name, link, target string
}

func components(p, link, target string) []component {
	var out []component
	for _, n := range strings.Split(p, "/") {
		if n != "" && n != "." {
			out = append(out, component{name: n, link: link, target: target})
		}
	}
	return out
}

// Resolve returns the host path (absolute, clean, no symbolic link in it) of the file that host
// path p reaches on the host seen through fsys (rooted at the host root), the way the host's
// kernel walks it: a link's absolute target starts again at the host root, a relative one from
// the link's directory, ".." is the parent of what was walked so far and stops at the root, so
// the result never leaves the host root. A missing tail is kept as it is (a file to be created);
// a link whose target does not exist, or more than MaxSymlinkHops links (a loop), is refused
// (ErrRefused) naming the link and its target, and so is a file that is not a directory where
// the path goes on below it (a regular file certs.d/docker.io), naming the file and its type. An fsys that cannot read links returns p cleaned.
func Resolve(fsys fs.FS, p string) (string, error) {
	if r, ok := fsys.(resolvingFS); ok {
		fsys = r.base
	}
	clean := path.Clean("/" + p)
	rl, ok := fsys.(fs.ReadLinkFS)
	if !ok {
		return clean, nil
	}
	rest := components(p, "", "")
	done := "/"
	hops := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		if c.name == ".." {
			done = path.Dir(done)
			continue
		}
		next := path.Join(done, c.name)
		fi, err := rl.Lstat(FSName(next))
		if errors.Is(err, fs.ErrNotExist) {
			return missingTail(p, next, c, rest)
		}
		if err != nil {
			return "", fmt.Errorf("resolve %s: %w", p, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if len(rest) > 0 && !fi.IsDir() {
				// The kernel answers ENOTDIR; say which file is in the way of which path.
				return "", refusal.Errorf("%s is %s where a directory is expected (on the way to %s): move it away or replace it with a directory; nothing was changed", next, inputfile.ModeWords(fi.Mode()), clean)
			}
			done = next
			continue
		}
		target, err := rl.ReadLink(FSName(next))
		if err != nil {
			return "", fmt.Errorf("resolve %s: read link %s: %w", p, next, err)
		}
		if hops++; hops > MaxSymlinkHops {
			return "", refusal.Errorf("%s: more than %d symbolic links (a loop?), the last %s -> %s: fix the link; nothing was changed", clean, MaxSymlinkHops, next, target)
		}
		if target == "" {
			return "", refusal.Errorf("%s is a symbolic link with an empty target: fix or remove it; nothing was changed", next)
		}
		if strings.HasPrefix(target, "/") {
			done = "/"
		}
		rest = append(components(target, next, target), rest...)
	}
	return done, nil
}

// missingTail is Resolve's answer when next (reached as component c of p) does not exist: the
// path with the rest of p kept as it is, or a refusal when c came from a link (its target is
// missing), or no path when the rest goes up out of the missing directory.
func missingTail(p, next string, c component, rest []component) (string, error) {
	if c.link != "" {
		return "", refusal.Errorf("%s is a symbolic link to %s, which does not exist under the host root (%s is missing): fix or remove the link; nothing was changed", c.link, c.target, next)
	}
	tail := []string{next}
	for _, r := range rest {
		if r.name == ".." {
			// The kernel stops at the missing directory; "x/missing/.." is no path.
			return "", &fs.PathError{Op: "resolve", Path: p, Err: fs.ErrNotExist}
		}
		tail = append(tail, r.name)
	}
	return path.Join(tail...), nil
}

// ResolveChanges points every change at the file its Path reaches through symbolic links (see
// Resolve), so that Apply edits that file in place and leaves the links as they are: Path
// becomes the real file and Via the path as planned; an update's Backup moves next to the real
// file; a restore's Backup has its directories resolved, and a Backup that is itself a symbolic
// link is refused (RefuseLinkedBackup); PruneDir is dropped when the file's directory itself
// is a link (the directory it leads to is not ours to remove; one under a linked parent is). Two removals of
// one file become one; any other two changes that reach the same file are refused. fsys must be
// the one the changes were planned with. The input slice is not modified.
func ResolveChanges(fsys fs.FS, cs []Change) ([]Change, error) {
	out := make([]Change, 0, len(cs))
	seen := map[string]int{}
	for _, orig := range cs {
		planned := path.Clean("/" + orig.Path)
		c, err := resolveChange(fsys, orig, planned)
		if err != nil {
			return nil, err
		}
		real := c.Path
		if i, dup := seen[real]; dup {
			prev := out[i]
			if prev.Action == ActionRemove && c.Action == ActionRemove {
				continue
			}
			first := prev.Via
			if first == "" {
				first = prev.Path
			}
			return nil, refusal.Errorf("%s and %s are the same file %s (through symbolic links): nodecache will not plan it twice; nothing was changed", first, planned, real)
		}
		seen[real] = len(out)
		out = append(out, c)
	}
	return out, nil
}

// resolveChange points c (planned at the clean host path planned) at the file it reaches, as
// ResolveChanges describes, and refuses a backup that is a symbolic link.
func resolveChange(fsys fs.FS, c Change, planned string) (Change, error) {
	real, err := Resolve(fsys, planned)
	if err != nil {
		return c, err
	}
	if real != planned {
		c.Via = planned
		if c.PruneDir {
			// The directory to prune must be the planned one reached by name, not the
			// target of a link named like it (…/certs.d/docker.io -> /elsewhere).
			pd := path.Dir(planned)
			parent, err := Resolve(fsys, path.Dir(pd))
			if err != nil || path.Join(parent, path.Base(pd)) != path.Dir(real) {
				c.PruneDir = false
			}
		}
	}
	c.Path = real
	switch {
	case c.Action == ActionUpdate && c.Backup != "":
		c.Backup = real + BackupSuffix
	case c.Action == ActionRestore && c.Backup != "":
		// Its directories resolved, never the backup itself (RefuseLinkedBackup).
		dir, err := Resolve(fsys, path.Dir(path.Clean("/"+c.Backup)))
		if err != nil {
			return c, err
		}
		c.Backup = path.Join(dir, path.Base(c.Backup))
	}
	if c.Backup != "" {
		if err := RefuseLinkedBackup(fsys, c.Backup); err != nil {
			return c, err
		}
	}
	return c, nil
}

// RefuseLinkedBackup refuses (ErrRefused) a backup path p (a host path, its directories
// resolved) that is a symbolic link, naming the link and its target; nil when p is no link or
// does not exist. A <file>.nodecache.bak is a regular file Apply wrote itself: a link there was
// put by someone else, and following it would restore (rename) the file it leads to over the
// config, e.g. a /srv/data/important.toml, or take that file as the original. It is checked with
// Lstat (the link itself, never what it leads to) through fsys's view of the host (Resolving).
func RefuseLinkedBackup(fsys fs.FS, p string) error {
	fsys = Resolving(fsys)
	fi, err := fs.Lstat(fsys, FSName(p))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		if errors.Is(err, ErrRefused) {
			return err
		}
		return fmt.Errorf("backup %s: %w", p, err)
	case fi.Mode()&fs.ModeSymlink == 0:
		return nil
	}
	target, err := fs.ReadLink(fsys, FSName(p))
	if err != nil {
		target = "?"
	}
	return refusal.Errorf("%s is a symbolic link to %s, not the backup nodecache wrote: nodecache never reads, restores or writes a backup through a link; "+
		"if %s is the original, put a copy of it at %s in place of the link and run again (or restore the config by hand and delete the link); nothing was changed",
		p, target, target, p)
}

// ReadBackup reads the backup at host path p (its directories resolved) like ReadFile, after
// RefuseLinkedBackup: a missing backup returns (nil, false, nil), a symbolic link at p is refused
// (ErrRefused) naming it, and so is anything but a regular file of at most
// inputfile.RuntimeConfig.Limit bytes.
func ReadBackup(fsys fs.FS, p string) (data []byte, exists bool, err error) {
	if err := RefuseLinkedBackup(fsys, p); err != nil {
		return nil, false, err
	}
	return ReadFile(fsys, p)
}
