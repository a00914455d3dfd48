package bootstraptest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/bootstrap"
)

// ProcTree is a synthetic procfs tree with the files bootstrap.Host reads (self/auxv,
// <pid>/comm, <pid>/stat, <pid>/cmdline, <pid>/fd, <pid>/net/unix) and the boot time a Host
// built with Host injects.
type ProcTree struct {
	t testing.TB
	// Root is the tree's directory (the proc root).
	Root string
	// Boot is the injected boot time.
	Boot time.Time
	// Hz is the clock tick rate in self/auxv.
	Hz uint64
}

// NewProcTree builds an empty tree in a temporary directory, booted at boot, with 100 Hz ticks.
func NewProcTree(t testing.TB, boot time.Time) *ProcTree {
	t.Helper()
	p := &ProcTree{t: t, Root: filepath.Join(t.TempDir(), "proc"), Boot: boot, Hz: 100}
	p.WriteBytes("self/auxv", bootstrap.EncodeAuxv([2]uint64{6, 4096}, [2]uint64{17, p.Hz}, [2]uint64{23, 0}))
	return p
}

// Host returns a view of the host root hostRoot whose processes come from this tree.
func (p *ProcTree) Host(hostRoot string) *bootstrap.Host {
	p.t.Helper()
	h, err := bootstrap.NewHost(bootstrap.HostOptions{Root: hostRoot, ProcRoot: p.Root,
		BootTime: func() (time.Time, error) { return p.Boot, nil }})
	if err != nil {
		p.t.Fatal(err)
	}
	return h
}

// Write writes content at rel under the tree.
func (p *ProcTree) Write(rel, content string) { p.WriteBytes(rel, []byte(content)) }

// WriteBytes writes b at rel under the tree, creating directories.
func (p *ProcTree) WriteBytes(rel string, b []byte) {
	p.t.Helper()
	file := filepath.Join(p.Root, rel)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// StatLine renders a /proc/<pid>/stat line as Linux 6.x prints it (52 fields).
func StatLine(pid int, comm string, startTicks uint64) string {
	f := []string{strconv.Itoa(pid), "(" + comm + ")", "S", "1", strconv.Itoa(pid), strconv.Itoa(pid),
		"0", "-1", "4194560", "2048", "0", "3", "0", "15", "7", "0", "0", "20", "0", "14", "0",
		strconv.FormatUint(startTicks, 10)}
	for len(f) < 52 {
		f = append(f, "0")
	}
	return strings.Join(f, " ") + "\n"
}

// Ticks returns the starttime (clock ticks after boot) of a process started at start, rounded
// down to a tick as the kernel does.
func (p *ProcTree) Ticks(start time.Time) uint64 {
	d := start.Sub(p.Boot)
	if d < 0 {
		p.t.Fatalf("start %s before boot %s", start, p.Boot)
	}
	return uint64(d / (time.Second / time.Duration(p.Hz)))
}

// AddProcess adds pid with comm, started at start (rounded down to a tick), and its arguments.
func (p *ProcTree) AddProcess(pid int, comm string, start time.Time, args ...string) {
	p.AddProcessTicks(pid, comm, p.Ticks(start), args...)
}

// AddProcessTicks adds pid with comm, started startTicks clock ticks after boot.
func (p *ProcTree) AddProcessTicks(pid int, comm string, startTicks uint64, args ...string) {
	p.t.Helper()
	dir := strconv.Itoa(pid)
	p.Write(dir+"/comm", comm+"\n")
	p.Write(dir+"/stat", StatLine(pid, comm, startTicks))
	cmd := strings.Join(args, "\x00")
	if cmd != "" {
		cmd += "\x00"
	}
	p.Write(dir+"/cmdline", cmd)
	p.Write(dir+"/net/unix", "Num       RefCount Protocol Flags    Type St Inode Path\n")
	if err := os.MkdirAll(filepath.Join(p.Root, dir, "fd"), 0o755); err != nil {
		p.t.Fatal(err)
	}
	p.FD(pid, 0, "/dev/null")
}

// Remove deletes pid from the tree (the process exited).
func (p *ProcTree) Remove(pid int) {
	p.t.Helper()
	if err := os.RemoveAll(filepath.Join(p.Root, strconv.Itoa(pid))); err != nil {
		p.t.Fatal(err)
	}
}

// Listen makes pid hold a listening unix socket at path with inode.
func (p *ProcTree) Listen(pid int, path string, inode uint64) {
	p.t.Helper()
	p.SeeSocket(pid, path, inode)
	p.FD(pid, int(inode%1000)+3, fmt.Sprintf("socket:[%d]", inode))
}

// SeeSocket adds a listening socket of another process to pid's socket table (same network
// namespace) without giving pid a descriptor for it.
func (p *ProcTree) SeeSocket(pid int, path string, inode uint64) {
	p.t.Helper()
	file := filepath.Join(p.Root, strconv.Itoa(pid), "net", "unix")
	b, err := os.ReadFile(file)
	if err != nil {
		p.t.Fatal(err)
	}
	line := fmt.Sprintf("0000000000000000: 00000002 00000000 00010000 0001 01 %d %s\n", inode, path)
	if err := os.WriteFile(file, append(b, line...), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// FD makes descriptor n of pid a link to target.
func (p *ProcTree) FD(pid, n int, target string) {
	p.t.Helper()
	link := filepath.Join(p.Root, strconv.Itoa(pid), "fd", strconv.Itoa(n))
	_ = os.Remove(link)
	if err := os.Symlink(target, link); err != nil {
		p.t.Fatal(err)
	}
}
