package bootstrap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/prometheus/procfs"

	"github.com/nodecache/nodecache/internal/inputfile"
)

// Processes are read from Host.ProcRoot with github.com/prometheus/procfs (listing, comm, the
// starttime field of /proc/<pid>/stat, descriptor targets). Two things nodecache reads itself:
//   - the clock tick rate: procfs's ProcStat.StartTime assumes 100 Hz and adds the whole-second
//     /proc/stat btime (a start time then reads up to 1 s early: measured 0.56 s). A Go program
//     cannot call sysconf(_SC_CLK_TCK); the kernel hands the rate to every process in its
//     auxiliary vector as AT_CLKTCK, read from <proc>/self/auxv;
//   - the boot time, as CLOCK_REALTIME − CLOCK_BOOTTIME in nanoseconds (ClockBootTime), so a
//     start time has the precision of one clock tick (10 ms at USER_HZ 100): the true start is
//     in [Start, Start + one tick).

// Process is one process found under the proc root.
type Process struct {
	// PID is the process id in the namespace of the proc root.
	PID int `json:"pid"`
	// Comm is the command name from /proc/<pid>/comm (at most 15 bytes, kernel-truncated).
	Comm string `json:"comm"`
	// Start is when the process started: boot time + starttime ÷ CLK_TCK. The true start is in
	// [Start, Start + Tick).
	Start time.Time `json:"start"`
	// Tick is the clock tick (10 ms at 100 Hz), the precision of Start.
	Tick time.Duration `json:"-"`
}

// ErrNoClockTicks reports an auxiliary vector without a usable AT_CLKTCK entry.
var ErrNoClockTicks = errors.New("no AT_CLKTCK entry (or zero) in the auxiliary vector")

// ErrNoFDAccess reports a process whose descriptors cannot be read (permission: another user's
// process without CAP_SYS_PTRACE).
var ErrNoFDAccess = errors.New("descriptors not readable")

// errOtherComm marks a process whose name only looks like the one asked for once trimmed.
var errOtherComm = errors.New("another command name")

// atClkTck is the auxiliary vector key of the clock tick rate (linux/auxvec.h AT_CLKTCK).
const atClkTck = 17

// BootTime returns the boot time from the host's BootTime source (read on every call: the agent
// lives for days, and a stepped wall clock moves it).
func (h *Host) BootTime() (time.Time, error) {
	t, err := h.bootTime()
	if err != nil {
		return time.Time{}, fmt.Errorf("read boot time: %w", err)
	}
	return t, nil
}

// ClockTicks returns the clock tick rate (ticks per second, USER_HZ) from AT_CLKTCK in
// <proc>/self/auxv, read once. ErrNoClockTicks when the entry is missing or zero.
func (h *Host) ClockTicks() (uint64, error) {
	h.clock.once.Do(func() {
		file := filepath.Join(h.procRoot, "self", "auxv")
		b, err := inputfile.Read(file, inputfile.Proc)
		if err != nil {
			h.clock.err = fmt.Errorf("read clock tick rate: %w", err)
			return
		}
		if h.clock.hz, err = ParseAuxvClockTicks(b); err != nil {
			h.clock.err = fmt.Errorf("read clock tick rate %s: %w", file, err)
		}
	})
	return h.clock.hz, h.clock.err
}

// ParseAuxvClockTicks reads AT_CLKTCK from an auxiliary vector: (key, value) pairs of native
// machine words, ended by key 0. ErrNoClockTicks when the entry is missing or zero.
func ParseAuxvClockTicks(b []byte) (uint64, error) {
	const word = int(unsafe.Sizeof(uintptr(0)))
	if len(b)%(2*word) != 0 {
		return 0, fmt.Errorf("auxiliary vector of %d bytes is not a whole number of %d-byte pairs", len(b), 2*word)
	}
	read := func(at int) uint64 {
		if word == 8 {
			return binary.NativeEndian.Uint64(b[at:])
		}
		return uint64(binary.NativeEndian.Uint32(b[at:]))
	}
	for at := 0; at+2*word <= len(b); at += 2 * word {
		key, val := read(at), read(at+word)
		switch key {
		case 0:
			return 0, ErrNoClockTicks
		case atClkTck:
			if val == 0 {
				return 0, ErrNoClockTicks
			}
			return val, nil
		}
	}
	return 0, ErrNoClockTicks
}

// EncodeAuxv encodes (key, value) pairs as the kernel lays out an auxiliary vector on this
// machine, ended by AT_NULL. Tests use it to build synthetic /proc/self/auxv files.
func EncodeAuxv(pairs ...[2]uint64) []byte {
	const word = int(unsafe.Sizeof(uintptr(0)))
	var out []byte
	put := func(v uint64) {
		if word == 8 {
			out = binary.NativeEndian.AppendUint64(out, v)
		} else {
			out = binary.NativeEndian.AppendUint32(out, uint32(v))
		}
	}
	for _, kv := range pairs {
		put(kv[0])
		put(kv[1])
	}
	put(0)
	put(0)
	return out
}

func (h *Host) procfs() (procfs.FS, error) {
	fsys, err := procfs.NewFS(h.procRoot)
	if err != nil {
		return procfs.FS{}, fmt.Errorf("open process table %s: %w", h.procRoot, err)
	}
	return fsys, nil
}

// startOf converts a starttime in clock ticks after boot to a time.
func startOf(boot time.Time, ticks, hz uint64) time.Time {
	secs := ticks / hz
	frac := time.Duration(ticks%hz) * time.Second / time.Duration(hz)
	return boot.Add(time.Duration(secs)*time.Second + frac)
}

func tickOf(hz uint64) time.Duration { return time.Second / time.Duration(hz) }

// process reads the start of one procfs process; comm is what its comm file said.
func (h *Host) process(p procfs.Proc, comm string, boot time.Time, hz uint64) (Process, error) {
	st, err := p.Stat()
	if err != nil {
		return Process{}, fmt.Errorf("read process %d start: %w", p.PID, err)
	}
	if comm != "" && st.Comm != comm {
		if strings.TrimSpace(st.Comm) == comm {
			return Process{}, errOtherComm // "containerd " (procfs trims the comm file)
		}
		return Process{}, fmt.Errorf("read process %d: comm file says %q, stat says %q", p.PID, comm, st.Comm)
	}
	return Process{PID: p.PID, Comm: st.Comm, Start: startOf(boot, st.Starttime, hz), Tick: tickOf(hz)}, nil
}

// Processes returns every process whose comm is exactly comm, with its start time, in ascending
// pid order. Processes that exit while being read are skipped; any other failure to read a
// matching process is an error (its start time is evidence).
func (h *Host) Processes(comm string) ([]Process, error) {
	fsys, err := h.procfs()
	if err != nil {
		return nil, err
	}
	all, err := fsys.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("list processes in %s: %w", h.procRoot, err)
	}
	var (
		boot time.Time
		hz   uint64
		out  []Process
	)
	for _, p := range all {
		if p.PID <= 0 {
			continue
		}
		c, err := p.Comm()
		if Exited(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list processes: read comm of %d: %w", p.PID, err)
		}
		if c != comm {
			continue
		}
		if hz == 0 {
			if hz, err = h.ClockTicks(); err != nil {
				return nil, err
			}
			if boot, err = h.BootTime(); err != nil {
				return nil, err
			}
		}
		proc, err := h.process(p, comm, boot, hz)
		if Exited(err) || errors.Is(err, errOtherComm) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, proc)
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out, nil
}

// Process returns process pid with its start time.
func (h *Host) Process(pid int) (Process, error) {
	fsys, err := h.procfs()
	if err != nil {
		return Process{}, err
	}
	p, err := fsys.Proc(pid)
	if err != nil {
		return Process{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	hz, err := h.ClockTicks()
	if err != nil {
		return Process{}, err
	}
	boot, err := h.BootTime()
	if err != nil {
		return Process{}, err
	}
	return h.process(p, "", boot, hz)
}

// Cmdline returns the arguments of process pid (/proc/<pid>/cmdline).
func (h *Host) Cmdline(pid int) ([]string, error) {
	fsys, err := h.procfs()
	if err != nil {
		return nil, err
	}
	p, err := fsys.Proc(pid)
	if err != nil {
		return nil, fmt.Errorf("read command line of %d: %w", pid, err)
	}
	args, err := p.CmdLine()
	if err != nil {
		return nil, fmt.Errorf("read command line of %d: %w", pid, err)
	}
	if len(args) == 1 && args[0] == "" {
		return nil, nil
	}
	return args, nil
}

// Executable returns the local path of process pid's executable as the kernel holds it
// (<proc>/<pid>/exe), readable even when the binary was replaced or deleted since it started.
// Read it (debug/buildinfo), never run it.
func (h *Host) Executable(pid int) string {
	return filepath.Join(h.procRoot, strconv.Itoa(pid), "exe")
}

// Which of several processes serves a unix socket (Talos runs two containerd daemons: the
// system one on /system/run/containerd/containerd.sock and the CRI one on
// /run/containerd/containerd.sock): the listening socket bound at that path has an inode,
// listed in /proc/<pid>/net/unix (the socket table of that process's network namespace, which
// procfs's FS.NetUNIX does not read: it reads the namespace of the proc mount's owner), and the
// process holds a descriptor whose link reads "socket:[<inode>]".

// listenFlag is the unix socket table flag of a listening socket (__SO_ACCEPTCON).
const listenFlag = 0x10000

// listeningInodes returns the inodes of listening unix sockets bound at path, from
// <proc>/<pid>/net/unix.
func (h *Host) listeningInodes(pid int, path string) (map[uint64]bool, error) {
	file := filepath.Join(h.procRoot, strconv.Itoa(pid), "net", "unix")
	b, err := inputfile.Read(file, inputfile.Proc)
	if err != nil {
		return nil, fmt.Errorf("read unix socket table: %w", err)
	}
	out := map[uint64]bool{}
	for i, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if line == "" || (i == 0 && strings.HasPrefix(line, "Num")) {
			continue
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
		inode, err := strconv.ParseUint(f[6], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("read unix socket table %s: inode %q: want a decimal number", file, f[6])
		}
		if flags&listenFlag != 0 && afterFields(line, 7) == path {
			out[inode] = true
		}
	}
	return out, nil
}

// socketInodes returns the inodes of every socket process pid holds open. ErrNoFDAccess when
// its descriptors may not be read.
func (h *Host) socketInodes(pid int) (map[uint64]bool, error) {
	fsys, err := h.procfs()
	if err != nil {
		return nil, err
	}
	p, err := fsys.Proc(pid)
	if err != nil {
		return nil, fmt.Errorf("list descriptors of %d: %w", pid, err)
	}
	targets, err := p.FileDescriptorTargets()
	if errors.Is(err, fs.ErrPermission) {
		return nil, fmt.Errorf("list descriptors of %d: %w", pid, ErrNoFDAccess)
	}
	if err != nil {
		return nil, fmt.Errorf("list descriptors of %d: %w", pid, err)
	}
	out := map[uint64]bool{}
	for _, t := range targets {
		inner, ok := strings.CutPrefix(t, "socket:[")
		if !ok {
			continue
		}
		if inner, ok = strings.CutSuffix(inner, "]"); !ok {
			continue
		}
		if n, err := strconv.ParseUint(inner, 10, 64); err == nil {
			out[n] = true
		}
	}
	return out, nil
}

// ListensOn reports whether process pid holds the listening unix socket bound at path (path as
// the process sees it) and its inode. ErrNoFDAccess (wrapped) when its descriptors may not be
// read. A process that exits meanwhile listens on nothing.
func (h *Host) ListensOn(pid int, path string) (bool, uint64, error) {
	want, err := h.listeningInodes(pid, path)
	if Exited(err) || (err != nil && h.gone(pid)) {
		return false, 0, nil
	}
	if err != nil || len(want) == 0 {
		return false, 0, err
	}
	have, err := h.socketInodes(pid)
	if Exited(err) || (err != nil && !errors.Is(err, ErrNoFDAccess) && h.gone(pid)) {
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

// gone reports whether process pid has exited or is a zombie (exited, not yet reaped: its
// descriptors and namespaces are gone, so reading them fails).
func (h *Host) gone(pid int) bool {
	fsys, err := h.procfs()
	if err != nil {
		return false
	}
	p, err := fsys.Proc(pid)
	if err != nil {
		return true
	}
	st, err := p.Stat()
	return Exited(err) || (err == nil && (st.State == "Z" || st.State == "X"))
}

// Exited reports an error of reading a process that has exited meanwhile: its /proc entry is
// gone (ENOENT) or is being torn down (ESRCH, "no such process").
func Exited(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
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
