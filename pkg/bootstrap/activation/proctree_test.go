package activation

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// procTree builds a synthetic procfs tree with the files Proc reads.
type procTree struct {
	t    *testing.T
	Root string
}

const (
	testBtime = int64(1_700_000_000)
	testHz    = uint64(100)
)

func newProcTree(t *testing.T) *procTree {
	t.Helper()
	p := &procTree{t: t, Root: filepath.Join(t.TempDir(), "proc")}
	p.write("stat", fmt.Sprintf("cpu  1 2 3 4 5 6 7 0 0 0\ncpu0 1 2 3 4 5 6 7 0 0 0\nintr 1 2 3\nctxt 42\nbtime %d\nprocesses 7\n", testBtime))
	p.writeBytes("self/auxv", EncodeAuxv([2]uint64{6, 4096}, [2]uint64{atClkTck, testHz}, [2]uint64{23, 0}))
	return p
}

func (p *procTree) write(rel, content string) { p.writeBytes(rel, []byte(content)) }

func (p *procTree) writeBytes(rel string, b []byte) {
	p.t.Helper()
	file := filepath.Join(p.Root, rel)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// statLine renders a /proc/<pid>/stat line as Linux 6.x prints it (52 fields).
func statLine(pid int, comm string, startTicks uint64) string {
	f := []string{strconv.Itoa(pid), "(" + comm + ")", "S", "1", strconv.Itoa(pid), strconv.Itoa(pid),
		"0", "-1", "4194560", "2048", "0", "3", "0", "15", "7", "0", "0", "20", "0", "14", "0",
		strconv.FormatUint(startTicks, 10)}
	for len(f) < 52 {
		f = append(f, "0")
	}
	return strings.Join(f, " ") + "\n"
}

// addProcess adds pid with comm, started startTicks clock ticks after boot, and its arguments.
func (p *procTree) addProcess(pid int, comm string, startTicks uint64, args ...string) {
	p.t.Helper()
	dir := strconv.Itoa(pid)
	p.write(dir+"/comm", comm+"\n")
	p.write(dir+"/stat", statLine(pid, comm, startTicks))
	cmd := strings.Join(args, "\x00")
	if cmd != "" {
		cmd += "\x00"
	}
	p.write(dir+"/cmdline", cmd)
	p.write(dir+"/net/unix", "Num       RefCount Protocol Flags    Type St Inode Path\n")
	if err := os.MkdirAll(filepath.Join(p.Root, dir, "fd"), 0o755); err != nil {
		p.t.Fatal(err)
	}
	p.fd(pid, 0, "/dev/null")
}

// listen makes pid hold a listening unix socket at path with inode.
func (p *procTree) listen(pid int, path string, inode uint64) {
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
	p.fd(pid, int(inode%1000)+3, fmt.Sprintf("socket:[%d]", inode))
}

// seeSocket adds a listening socket of another process to pid's socket table (same network
// namespace) without giving pid a descriptor for it.
func (p *procTree) seeSocket(pid int, path string, inode uint64) {
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

func (p *procTree) fd(pid, n int, target string) {
	p.t.Helper()
	link := filepath.Join(p.Root, strconv.Itoa(pid), "fd", strconv.Itoa(n))
	_ = os.Remove(link)
	if err := os.Symlink(target, link); err != nil {
		p.t.Fatal(err)
	}
}

// ticksAt returns the starttime value of a process started at unix second sec.
func ticksAt(sec int64) uint64 { return uint64(sec-testBtime) * testHz }
