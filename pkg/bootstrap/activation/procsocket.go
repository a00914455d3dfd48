package activation

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Which of several processes serves a unix socket (Talos runs two containerd daemons: the
// system one on /system/run/containerd/containerd.sock and the CRI one on
// /run/containerd/containerd.sock).
//
// The robust answer is the kernel's own: the listening socket bound at that path has an inode
// number, listed in /proc/<pid>/net/unix (the socket table of that process's network
// namespace), and the process holds a descriptor whose link reads "socket:[<inode>]" in
// /proc/<pid>/fd. This holds however the address was chosen (flag, config file, default) and
// survives a relative path or a symlinked /run. Reading another process's fd directory needs
// the same user or CAP_SYS_PTRACE; when it is refused the command line is the fallback
// (--address/-a, else the config file's [grpc] address, else containerd's default).

// listenFlag is the unix socket table flag of a listening socket (__SO_ACCEPTCON).
const listenFlag = 0x10000

// ErrNoFDAccess reports a process whose descriptors cannot be read (permission).
var ErrNoFDAccess = errors.New("descriptors not readable")

// listeningInodes returns the inodes of listening unix sockets bound at path, from
// <root>/<pid>/net/unix.
func (p Proc) listeningInodes(pid int, path string) (map[uint64]bool, error) {
	file := p.path(strconv.Itoa(pid), "net", "unix")
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read unix socket table: %w", err)
	}
	out := map[uint64]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first {
			first = false
			if strings.HasPrefix(line, "Num") {
				continue
			}
		}
		// Num RefCount Protocol Flags Type St Inode [Path]; the path is the rest of the line.
		f := strings.Fields(line)
		if len(f) < 7 {
			return nil, fmt.Errorf("read unix socket table %s: line %q: want at least 7 fields", file, line)
		}
		if len(f) == 7 {
			continue // unnamed socket
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil {
			return nil, fmt.Errorf("read unix socket table %s: flags %q: want hexadecimal", file, f[3])
		}
		inode, err := parseDecimal(f[6])
		if err != nil {
			return nil, fmt.Errorf("read unix socket table %s: inode %q: want a decimal number", file, f[6])
		}
		sockPath := afterFields(line, 7)
		if flags&listenFlag != 0 && sockPath == path {
			out[inode] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read unix socket table %s: %w", file, err)
	}
	return out, nil
}

// socketInodes returns the inodes of every socket process pid holds open. ErrNoFDAccess when
// the fd directory or a link in it may not be read.
func (p Proc) socketInodes(pid int) (map[uint64]bool, error) {
	dir := p.path(strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("list %s: %w", dir, ErrNoFDAccess)
	}
	if err != nil {
		return nil, fmt.Errorf("list descriptors: %w", err)
	}
	out := map[uint64]bool{}
	for _, e := range entries {
		target, err := os.Readlink(p.path(strconv.Itoa(pid), "fd", e.Name()))
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("read %s/%s: %w", dir, e.Name(), ErrNoFDAccess)
		}
		if err != nil {
			continue // closed meanwhile
		}
		inner, ok := strings.CutPrefix(target, "socket:[")
		if !ok {
			continue
		}
		inner, ok = strings.CutSuffix(inner, "]")
		if !ok {
			continue
		}
		if n, err := parseDecimal(inner); err == nil {
			out[n] = true
		}
	}
	return out, nil
}

// ListensOn reports whether process pid holds the listening unix socket bound at path (path as
// the process sees it). ErrNoFDAccess (wrapped) when its descriptors may not be read. A process
// that exits meanwhile listens on nothing.
func (p Proc) ListensOn(pid int, path string) (bool, uint64, error) {
	want, err := p.listeningInodes(pid, path)
	if errors.Is(err, os.ErrNotExist) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, err
	}
	if len(want) == 0 {
		return false, 0, nil
	}
	have, err := p.socketInodes(pid)
	if errors.Is(err, os.ErrNotExist) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, err
	}
	for n := range want {
		if have[n] {
			return true, n, nil
		}
	}
	return false, 0, nil
}

// Cmdline returns the arguments of process pid from <root>/<pid>/cmdline (NUL-separated).
func (p Proc) Cmdline(pid int) ([]string, error) {
	file := p.path(strconv.Itoa(pid), "cmdline")
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read command line: %w", err)
	}
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil, nil
	}
	return strings.Split(string(b), "\x00"), nil
}

// flagValue returns the value of the first flag among names in args, in any of the forms
// urfave/cli accepts ("--name v", "--name=v", "-name v", "-name=v"; names given without
// dashes). Parsing stops at "--".
func flagValue(args []string, names ...string) (string, bool) {
	for i := 1; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		body := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		key, val, hasVal := strings.Cut(body, "=")
		for _, n := range names {
			if key != n {
				continue
			}
			if hasVal {
				return val, true
			}
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", true
		}
	}
	return "", false
}

// afterFields returns what follows the first n space-separated fields of line, without the
// separating spaces (a socket path may itself contain spaces).
func afterFields(line string, n int) string {
	rest := line
	for range n {
		rest = strings.TrimLeft(rest, " ")
		i := strings.IndexByte(rest, ' ')
		if i < 0 {
			return ""
		}
		rest = rest[i:]
	}
	return strings.TrimLeft(rest, " ")
}
