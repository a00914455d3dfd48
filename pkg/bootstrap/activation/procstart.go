package activation

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// Proc reads process facts from a procfs tree. Root is the mount point of procfs, "/proc" on a
// node; tests point it at a synthetic tree with the same layout (stat, self/auxv, <pid>/stat,
// <pid>/comm, <pid>/cmdline, <pid>/fd, <pid>/net/unix).
//
// Start times follow proc(5): /proc/stat "btime" (boot time, whole seconds since the epoch) plus
// field 22 of /proc/<pid>/stat ("starttime", clock ticks after boot) divided by the clock tick
// rate, which a Go program cannot get from sysconf(_SC_CLK_TCK); the kernel hands it to every
// process in the auxiliary vector as AT_CLKTCK, readable from /proc/self/auxv.
type Proc struct {
	Root string
}

// Process is one process found under a Proc root.
type Process struct {
	// PID is the process id in the namespace of the procfs mount.
	PID int
	// Comm is the command name from /proc/<pid>/comm (at most 15 bytes, kernel-truncated).
	Comm string
	// Start is when the process started, with a precision of one second (btime is whole
	// seconds): the true start is in [Start, Start+1s).
	Start time.Time
}

// ErrNoClockTicks reports an auxiliary vector without a usable AT_CLKTCK entry.
var ErrNoClockTicks = errors.New("no AT_CLKTCK entry (or zero) in the auxiliary vector")

// atClkTck is the auxiliary vector key of the clock tick rate (linux/auxvec.h AT_CLKTCK).
const atClkTck = 17

// starttimeField is the 1-based position of "starttime" in /proc/<pid>/stat (proc(5)).
const starttimeField = 22

func (p Proc) path(elem ...string) string {
	return filepath.Join(append([]string{p.Root}, elem...)...)
}

// BootTime returns the "btime" line of <root>/stat: the boot time in whole seconds since the
// epoch. A missing, repeated, non-decimal or zero btime is an error.
func (p Proc) BootTime() (time.Time, error) {
	file := p.path("stat")
	b, err := os.ReadFile(file)
	if err != nil {
		return time.Time{}, fmt.Errorf("read boot time: %w", err)
	}
	var (
		btime uint64
		found bool
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "btime" {
			continue
		}
		if found {
			return time.Time{}, fmt.Errorf("read boot time %s: btime appears twice", file)
		}
		if len(fields) != 2 {
			return time.Time{}, fmt.Errorf("read boot time %s: btime line %q: want \"btime SECONDS\"", file, sc.Text())
		}
		btime, err = parseDecimal(fields[1])
		if err != nil || btime == 0 {
			return time.Time{}, fmt.Errorf("read boot time %s: btime %q: want a positive decimal number of seconds", file, fields[1])
		}
		found = true
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, fmt.Errorf("read boot time %s: %w", file, err)
	}
	if !found {
		return time.Time{}, fmt.Errorf("read boot time %s: no btime line", file)
	}
	return time.Unix(int64(btime), 0), nil
}

// ClockTicks returns the clock tick rate (ticks per second, USER_HZ) from AT_CLKTCK in
// <root>/self/auxv. The vector is a sequence of (key, value) pairs of native machine words, ended
// by key 0. ErrNoClockTicks when the entry is missing or zero.
func (p Proc) ClockTicks() (uint64, error) {
	file := p.path("self", "auxv")
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("read clock tick rate: %w", err)
	}
	hz, err := parseAuxvClockTicks(b)
	if err != nil {
		return 0, fmt.Errorf("read clock tick rate %s: %w", file, err)
	}
	return hz, nil
}

func parseAuxvClockTicks(b []byte) (uint64, error) {
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

// procStat is what nodecache uses of /proc/<pid>/stat.
type procStat struct {
	pid       int
	comm      string
	startTick uint64
}

// parseStat parses the contents of /proc/<pid>/stat. The command name may contain spaces and
// parentheses, so the fields after it are counted from the last ") " (proc(5)). The pid must
// equal want, fields 4 to 22 must be decimal integers (signed where proc(5) allows it), and the
// state a single letter.
func parseStat(b []byte, want int) (procStat, error) {
	s := strings.TrimRight(string(b), "\n")
	open := strings.IndexByte(s, '(')
	closeAt := strings.LastIndex(s, ") ")
	if open < 0 || closeAt < open {
		return procStat{}, errors.New(`no "(comm) " part`)
	}
	pidStr := strings.TrimSpace(s[:open])
	pid, err := parseDecimal(pidStr)
	if err != nil || pid == 0 || int(pid) != want {
		return procStat{}, fmt.Errorf("pid field %q: want %d", pidStr, want)
	}
	rest := strings.Fields(s[closeAt+2:])
	// rest[0] is field 3 (state); field n is rest[n-3].
	if len(rest) < starttimeField-2 {
		return procStat{}, fmt.Errorf("%d fields after the command name: want at least %d", len(rest), starttimeField-2)
	}
	if len(rest[0]) != 1 || rest[0][0] < 'A' || rest[0][0] > 'z' {
		return procStat{}, fmt.Errorf("state field %q: want one letter", rest[0])
	}
	for n := 4; n < starttimeField; n++ {
		if _, err := strconv.ParseInt(rest[n-3], 10, 64); err != nil || !isSignedDecimal(rest[n-3]) {
			return procStat{}, fmt.Errorf("field %d %q: want a decimal integer", n, rest[n-3])
		}
	}
	tick, err := parseDecimal(rest[starttimeField-3])
	if err != nil {
		return procStat{}, fmt.Errorf("starttime (field %d) %q: want a decimal number of clock ticks", starttimeField, rest[starttimeField-3])
	}
	return procStat{pid: int(pid), comm: s[open+1 : closeAt], startTick: tick}, nil
}

// parseDecimal accepts only ASCII digits (no sign, no spaces, no 0x) that fit in 64 bits.
func parseDecimal(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("empty number")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a decimal number", s)
		}
	}
	return strconv.ParseUint(s, 10, 64)
}

func isSignedDecimal(s string) bool {
	s = strings.TrimPrefix(s, "-")
	_, err := parseDecimal(s)
	return err == nil
}

// StartTime returns when process pid started: btime + starttime ÷ CLK_TCK. Each input is read
// and validated; any failure is an error naming the file and the value refused.
func (p Proc) StartTime(pid int) (time.Time, error) {
	btime, err := p.BootTime()
	if err != nil {
		return time.Time{}, err
	}
	hz, err := p.ClockTicks()
	if err != nil {
		return time.Time{}, err
	}
	st, err := p.stat(pid)
	if err != nil {
		return time.Time{}, err
	}
	return startFrom(btime, st.startTick, hz), nil
}

func startFrom(btime time.Time, ticks, hz uint64) time.Time {
	secs := ticks / hz
	frac := time.Duration(ticks%hz) * time.Second / time.Duration(hz)
	return btime.Add(time.Duration(secs)*time.Second + frac)
}

func (p Proc) stat(pid int) (procStat, error) {
	file := p.path(strconv.Itoa(pid), "stat")
	b, err := os.ReadFile(file)
	if err != nil {
		return procStat{}, fmt.Errorf("read process start: %w", err)
	}
	st, err := parseStat(b, pid)
	if err != nil {
		return procStat{}, fmt.Errorf("read process start %s: %w", file, err)
	}
	return st, nil
}

// FindByComm returns every process whose /proc/<pid>/comm is exactly comm, with its start time,
// in ascending pid order. Processes that exit while being read are skipped; any other read or
// parse failure of a matching process is an error (its start time is evidence).
func (p Proc) FindByComm(comm string) ([]Process, error) {
	entries, err := os.ReadDir(p.Root)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var (
		btime time.Time
		hz    uint64
		out   []Process
	)
	for _, e := range entries {
		pid64, err := parseDecimal(e.Name())
		if err != nil || pid64 == 0 || pid64 > 1<<31 {
			continue
		}
		pid := int(pid64)
		c, err := os.ReadFile(p.path(e.Name(), "comm"))
		if errors.Is(err, fs.ErrNotExist) {
			continue // exited
		}
		if err != nil {
			return nil, fmt.Errorf("list processes: read comm of %d: %w", pid, err)
		}
		if strings.TrimSuffix(string(c), "\n") != comm {
			continue
		}
		if hz == 0 {
			if btime, err = p.BootTime(); err != nil {
				return nil, err
			}
			if hz, err = p.ClockTicks(); err != nil {
				return nil, err
			}
		}
		st, err := p.stat(pid)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if st.comm != comm {
			return nil, fmt.Errorf("read process %d: comm file says %q, stat says %q", pid, comm, st.comm)
		}
		out = append(out, Process{PID: pid, Comm: comm, Start: startFrom(btime, st.startTick, hz)})
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out, nil
}
