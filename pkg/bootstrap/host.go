package bootstrap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Defaults of HostOptions.
const (
	// DefaultHostRoot is the host root on the node itself.
	DefaultHostRoot = "/"
	// DefaultProcRoot is the procfs of this process's pid namespace: the host's process table
	// only with the host's pid namespace (a pod needs hostPID). It is not looked up under the
	// host root: process ids are signalled (CRI-O's SIGHUP) and so must be of this namespace.
	DefaultProcRoot = "/proc"
)

// HostOptions says where the host is and how to read its clocks.
type HostOptions struct {
	// Root is the directory the host's / is mounted at (--host-root: "/" on the node, "/host"
	// in a pod with the host's / mounted there). It must be an existing directory. Default
	// DefaultHostRoot.
	Root string
	// ProcRoot is the procfs mount of the host's process table. Default DefaultProcRoot; tests
	// point it at a synthetic tree with the same layout.
	ProcRoot string
	// BootTime returns when the kernel booted, with nanosecond precision. Default
	// ClockBootTime (CLOCK_REALTIME − CLOCK_BOOTTIME); tests inject the boot time of their
	// synthetic tree.
	BootTime func() (time.Time, error)
}

// Host is one view of the node: every host file read, written or stat'ed, every symbolic link
// resolved (an absolute target starts again at the host root, as the host's kernel does) and
// every process looked up by gen, status, the agent and the CRI-O reload goes through it. Build
// it once per command with NewHost. Safe for concurrent use.
type Host struct {
	root, procRoot string
	fsys           fs.FS
	bootTime       func() (time.Time, error)

	clock struct {
		once sync.Once
		boot time.Time
		hz   uint64
		err  error
	}
}

const wantRoot = "want the directory the host's / is mounted at, such as / or /host"

// NewHost checks the options and returns the view. A Root that does not exist or is not a
// directory is refused (ErrRefused, naming it as the --host-root flag) saying what is wanted; a
// relative ProcRoot too.
func NewHost(o HostOptions) (*Host, error) {
	if o.Root == "" {
		o.Root = DefaultHostRoot
	}
	if o.ProcRoot == "" {
		o.ProcRoot = DefaultProcRoot
	}
	if o.BootTime == nil {
		o.BootTime = ClockBootTime
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return nil, refusal.Errorf("--host-root %q: %v: %s", o.Root, err, wantRoot)
	}
	st, err := os.Stat(root)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, refusal.Errorf("--host-root %q does not exist: %s", o.Root, wantRoot)
	case err != nil:
		return nil, refusal.Errorf("--host-root %q: %v: %s", o.Root, err, wantRoot)
	case !st.IsDir():
		return nil, refusal.Errorf("--host-root %q is not a directory: %s", o.Root, wantRoot)
	}
	if !filepath.IsAbs(o.ProcRoot) {
		return nil, refusal.Errorf("proc root %q: want an absolute path such as /proc", o.ProcRoot)
	}
	return &Host{root: root, procRoot: filepath.Clean(o.ProcRoot), fsys: Resolving(os.DirFS(root)), bootTime: o.BootTime}, nil
}

// Root is the directory the host's / is mounted at, absolute and clean.
func (h *Host) Root() string { return h.root }

// ProcRoot is the procfs mount the host's processes are read from.
func (h *Host) ProcRoot() string { return h.procRoot }

// FS is the host's file tree (names without the leading slash) with links followed as the host
// follows them (see Resolving).
func (h *Host) FS() fs.FS { return h.fsys }

// Resolve returns the host path (absolute, clean, no link in it) that host path p reaches, as
// the host's kernel walks it (see Resolve): an absolute link target starts again at the host
// root. A missing tail is kept; a dangling link or a loop is refused (ErrRefused).
func (h *Host) Resolve(p string) (string, error) { return Resolve(h.fsys, p) }

// Local returns the path in this process's view of host path p after resolving it: Root joined
// with Resolve(p). This is the name to hand to code that opens files itself (containerd's
// hosts.toml parser, containers/image, a unix socket dial).
func (h *Host) Local(p string) (string, error) {
	real, err := h.Resolve(p)
	if err != nil {
		return "", err
	}
	return filepath.Join(h.root, FSName(real)), nil
}

// ReadFile reads host path p, links resolved under the host root: a regular file of at most
// inputfile.RuntimeConfig.Limit bytes; another type or a larger file is refused (ErrRefused)
// naming p.
func (h *Host) ReadFile(p string) ([]byte, error) {
	return inputfile.ReadFS(h.fsys, FSName(p), p, inputfile.RuntimeConfig)
}

// Stat describes the file host path p leads to.
func (h *Host) Stat(p string) (fs.FileInfo, error) { return fs.Stat(h.fsys, FSName(p)) }

// ReadDir lists the directory host path p leads to, sorted by name.
func (h *Host) ReadDir(p string) ([]fs.DirEntry, error) { return fs.ReadDir(h.fsys, FSName(p)) }

// Exists reports whether host path p leads to an existing file or directory.
func (h *Host) Exists(p string) bool {
	_, err := h.Stat(p)
	return err == nil
}

// IsDir reports whether host path p leads to a directory (through links, as the host sees it).
func (h *Host) IsDir(p string) bool {
	st, err := h.Stat(p)
	return err == nil && st.IsDir()
}

// Applier returns the applier that writes planned changes under this host's root.
func (h *Host) Applier(log zerolog.Logger) Applier { return Applier{Root: h.root, Logger: log} }

// Display returns host path p as a user names it on the host: p itself when it leads to no
// link, else "p -> resolved".
func (h *Host) Display(p string) string {
	real, err := h.Resolve(p)
	if err != nil || real == path.Clean("/"+p) {
		return p
	}
	return fmt.Sprintf("%s -> %s", p, real)
}
