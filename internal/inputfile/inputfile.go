// Package inputfile reads the files nodecache is pointed at — the ones a user names in a flag or
// a settings file (machine configs, PEM certificates and keys, docker config.json, the YAML
// settings file, image lists) and the host files it inspects or edits (containerd and CRI-O
// configs and drop-ins, hosts.toml, /etc/os-release, procfs) — with two guards, so that no such
// input can block the process or exhaust its memory:
//
//   - Only a regular file is read (symbolic links followed). A directory, a named pipe (FIFO),
//     a character or block device or a socket is refused after a stat and before any open, so a
//     FIFO never blocks the caller; the file is then opened non-blocking and checked again on the
//     open descriptor, so a file swapped in between cannot block either. A Kind may allow pipes
//     (the image list, so that `--images-from <(cmd)` works): the read then waits for the writer,
//     as the user asked.
//   - At most Kind.Limit bytes are read. A file whose stat says more is refused unread; one that
//     reports a smaller size and grows, or a procfs file (which reports size 0), is read up to
//     the limit plus one byte, and refused when that byte arrives.
//
// Refusals are *refusal.Error (errors.Is(err, refusal.ErrRefused), exit 2 in the CLI): the file
// as the caller names it, what was wrong, and what is accepted — "/etc/ca.pem is a named pipe
// (FIFO); want a PEM file: a regular file of at most 1 MiB". Refused tells them from the
// caller's own refusals. A file that cannot be stat'ed, opened or read returns the *fs.PathError
// of that step unchanged, so errors.Is(err, fs.ErrNotExist) still tells a missing file.
package inputfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/nodecache/nodecache/pkg/refusal"
)

// Binary size units, in bytes.
const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
)

// Kind is one kind of input file: what it holds (for messages), the most bytes read, and
// whether a pipe is accepted besides a regular file.
type Kind struct {
	// Name says what the file should hold, as a noun phrase with its article: "a Talos
	// machine config (YAML)".
	Name string
	// Limit is the most bytes read, > 0; a larger file is refused.
	Limit int64
	// Pipes also accepts a named pipe or an inherited pipe (/dev/fd/N, /dev/stdin), read until
	// its writer closes it, still bounded by Limit.
	Pipes bool
}

// The kinds nodecache reads. Limits are far above any real file of the kind (a Talos machine
// config is ~20 KiB, a containerd config.toml ~10 KiB, a certificate chain ~10 KiB) and far below
// what would strain a node.
var (
	// MachineConfig is a node's Talos machine config (--machine-config of gen talos and warm).
	MachineConfig = Kind{Name: "a Talos machine config (YAML)", Limit: 4 * MiB}
	// Patch is the existing content of gen talos -o FILE, read to diff and to check ownership.
	Patch = Kind{Name: "a Talos machine-config patch (YAML)", Limit: 4 * MiB}
	// RuntimeConfig is a file of the host's container runtime setup under --host-root:
	// containerd's config.toml and its imports, hosts.toml, CRI-O's crio.conf and drop-ins,
	// registries.conf(.d), the backups gen keeps of them, and /etc/os-release.
	RuntimeConfig = Kind{Name: "a container runtime config file", Limit: 4 * MiB}
	// Executable is a container runtime's binary, only checked (Check): debug/buildinfo reads
	// the parts it needs.
	Executable = Kind{Name: "an executable", Limit: 1 * GiB}
	// PEM is a PEM certificate (chain), CA bundle or private key (--tls-cert, --tls-key,
	// --upstream-ca, --mirror-ca).
	PEM = Kind{Name: "a PEM file", Limit: 1 * MiB}
	// DockerConfig is a docker config.json or Kubernetes .dockerconfigjson (--upstream-auth).
	DockerConfig = Kind{Name: "a docker config.json or .dockerconfigjson", Limit: 4 * MiB}
	// Settings is the YAML settings file (--config, NODECACHE_CONFIG).
	Settings = Kind{Name: "a YAML settings file", Limit: 1 * MiB}
	// ImageList is --images-from FILE: one image reference per line; a pipe is accepted.
	ImageList = Kind{Name: "an image list (one reference per line)", Limit: 16 * MiB, Pipes: true}
	// Proc is a procfs file (/proc/<pid>/…): regular files that report size 0.
	Proc = Kind{Name: "a procfs file", Limit: 4 * MiB}
	// Index is the cache's index file under --root (one entry per blob).
	Index = Kind{Name: "the cache index file", Limit: 1 * GiB}
	// Pins is the cache's pins file under --root (one entry per pin).
	Pins = Kind{Name: "the cache pins file", Limit: 64 * MiB}
	// Lock is the lock file under --root holding its owner's process id.
	Lock = Kind{Name: "a lock file", Limit: 4 * KiB}
	// PeerList is --peers file:PATH: one HOST:PORT a line.
	PeerList = Kind{Name: "a peer list (one HOST:PORT a line)", Limit: 1 * MiB}
	// PeerKeys is --peer-key-file: one or two HMAC keys, one a line.
	PeerKeys = Kind{Name: "a peer key file (one or two keys, one a line)", Limit: 4 * KiB}
)

// notAccepted is the cause (refusal.Error.Err) of this package's refusals: the kind the file
// was read as. Refused looks for it.
type notAccepted struct{ kind Kind }

func (e *notAccepted) Error() string { return "not " + e.kind.Name }

// refuse is the refusal of the file named source, which was not of kind k: problem says what it
// is instead, as a predicate ("is a named pipe (FIFO)", "is 5242880 bytes").
func refuse(source string, k Kind, problem string) error {
	want := "a regular file"
	if k.Pipes {
		want = "a regular file or a pipe"
	}
	return &refusal.Error{Source: source, Reason: fmt.Sprintf("%s; want %s: %s of at most %s", problem, k.Name, want, Size(k.Limit)),
		Err: &notAccepted{kind: k}}
}

// Refused reports whether err is, or wraps, a refusal of this package: a file of another type,
// or larger than its kind's limit. Other refusals (refusal.ErrRefused), such as a symbolic link
// that bootstrap.Resolve refuses on the way to the file, are not.
func Refused(err error) bool {
	var na *notAccepted
	return errors.As(err, &na)
}

// Read returns the content of the file at path (symbolic links followed), refusing (naming it
// path) one that is not a regular file (or pipe, when k allows) or holds more than k.Limit bytes.
func Read(path string, k Kind) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := check(path, fi, k); err != nil {
		return nil, err
	}
	flag := os.O_RDONLY
	if !k.Pipes {
		flag |= syscall.O_NONBLOCK // a FIFO swapped in after the stat opens without blocking
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(path, f, k)
}

// ReadFS is Read for name in fsys (fs.ValidPath form); a refusal names the file source, as the
// user knows it (a host path, "--mirror-ca /etc/ca.pem: /host/etc/ca.pem"). The file is stat'ed through fsys before
// it is opened, so fsys must implement fs.StatFS (os.DirFS does): without it fs.Stat opens the
// file, and opening a FIFO blocks. fsys.Open cannot be told not to block either, so a regular
// file replaced by a FIFO between the stat and the open would still block.
func ReadFS(fsys fs.FS, name, source string, k Kind) ([]byte, error) {
	fi, err := fs.Stat(fsys, name)
	if err != nil {
		return nil, err
	}
	if err := check(source, fi, k); err != nil {
		return nil, err
	}
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(source, f, k)
}

// Check refuses path as Read would, without reading it: for files that a library opens itself
// (containerd's hosts.toml parser, urfave/cli's YAML loader, Go's debug/buildinfo). Errors of
// the stat are returned unchanged.
func Check(path string, k Kind) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	return check(path, fi, k)
}

// CheckFS is Check for name in fsys; a refusal names the file source, as ReadFS does.
func CheckFS(fsys fs.FS, name, source string, k Kind) error {
	fi, err := fs.Stat(fsys, name)
	if err != nil {
		return err
	}
	return check(source, fi, k)
}

// check refuses fi (the stat of the file named source) when its type or size is not accepted.
func check(source string, fi fs.FileInfo, k Kind) error {
	if p := typeProblem(fi.Mode(), k); p != "" {
		return refuse(source, k, p)
	}
	if fi.Mode().IsRegular() && fi.Size() > k.Limit {
		return refuse(source, k, fmt.Sprintf("is %d bytes", fi.Size()))
	}
	return nil
}

// read reads f (the file named source) up to k.Limit, checking again on the open file what the
// path led to.
func read(source string, f fs.File, k Kind) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := check(source, fi, k); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, k.Limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > k.Limit {
		return nil, refuse(source, k, "holds more than "+Size(k.Limit))
	}
	return b, nil
}

// typeProblem says what mode is when k does not accept it, else "".
func typeProblem(mode fs.FileMode, k Kind) string {
	if mode.IsRegular() || (mode.Type()&fs.ModeNamedPipe != 0 && k.Pipes) {
		return ""
	}
	return "is " + ModeWords(mode)
}

// ModeWords names the type of a file mode in words, with its article: "a regular file", "a
// directory", "a named pipe (FIFO)", "a character device", "a block device", "a socket", "a
// symbolic link", else "not a regular file (<mode>)".
func ModeWords(mode fs.FileMode) string {
	switch t := mode.Type(); {
	case t == 0:
		return "a regular file"
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeCharDevice != 0:
		return "a character device"
	case t&fs.ModeDevice != 0:
		return "a block device"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeSymlink != 0:
		return "a symbolic link"
	default:
		return "not a regular file (" + t.String() + ")"
	}
}

// Size writes n bytes in the largest binary unit that keeps it at or above 1, one decimal when
// not whole: "4 MiB", "1.5 KiB", "512 bytes".
func Size(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}} {
		if n >= u.size {
			if n%u.size == 0 {
				return fmt.Sprintf("%d %s", n/u.size, u.name)
			}
			return fmt.Sprintf("%.1f %s", float64(n)/float64(u.size), u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}
