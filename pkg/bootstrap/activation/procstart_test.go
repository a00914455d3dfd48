package activation

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStartTime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, p *procTree)
		want  time.Time
		err   string
	}{
		{
			name:  "whole and fractional ticks",
			setup: func(t *testing.T, p *procTree) { p.addProcess(42, "containerd", 12345) },
			want:  time.Unix(testBtime+123, 450_000_000),
		},
		{
			name: "comm with spaces and parentheses",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "x) 1 2 (y", 500)
			},
			want: time.Unix(testBtime+5, 0),
		},
		{
			name: "comm that looks like the fields",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, ") S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 999 ", 700)
			},
			want: time.Unix(testBtime+7, 0),
		},
		{
			name: "non-digit starttime",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				p.write("42/stat", strings.Replace(statLine(42, "containerd", 1), " 1 0 0 0", " 1x 0 0 0", 1))
			},
			err: "starttime (field 22)",
		},
		{
			name: "non-digit field before starttime",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				p.write("42/stat", strings.Replace(statLine(42, "containerd", 1), " 4194560 ", " 0x400100 ", 1))
			},
			err: `field 9 "0x400100"`,
		},
		{
			name: "negative starttime",
			setup: func(t *testing.T, p *procTree) {
				p.write("42/stat", strings.Replace(statLine(42, "containerd", 777), " 777 ", " -777 ", 1))
			},
			err: "starttime",
		},
		{
			name: "pid field does not match",
			setup: func(t *testing.T, p *procTree) {
				p.write("42/stat", statLine(43, "containerd", 1))
			},
			err: `pid field "43"`,
		},
		{
			name: "truncated stat",
			setup: func(t *testing.T, p *procTree) {
				p.write("42/stat", "42 (containerd) S 1 2 3\n")
			},
			err: "fields after the command name",
		},
		{
			name: "no comm part",
			setup: func(t *testing.T, p *procTree) {
				p.write("42/stat", "42 containerd S 1 2 3\n")
			},
			err: `no "(comm) " part`,
		},
		{
			name: "missing CLK_TCK",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				p.writeBytes("self/auxv", EncodeAuxv([2]uint64{6, 4096}))
			},
			err: ErrNoClockTicks.Error(),
		},
		{
			name: "zero CLK_TCK",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				p.writeBytes("self/auxv", EncodeAuxv([2]uint64{atClkTck, 0}))
			},
			err: ErrNoClockTicks.Error(),
		},
		{
			name: "CLK_TCK after AT_NULL does not count",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				b := EncodeAuxv()
				p.writeBytes("self/auxv", append(b, EncodeAuxv([2]uint64{atClkTck, 100})...))
			},
			err: ErrNoClockTicks.Error(),
		},
		{
			name: "torn auxv",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				p.writeBytes("self/auxv", EncodeAuxv([2]uint64{atClkTck, 100})[:5])
			},
			err: "not a whole number",
		},
		{
			name: "no auxv",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				if err := os.Remove(filepath.Join(p.Root, "self", "auxv")); err != nil {
					t.Fatal(err)
				}
			},
			err: "read clock tick rate",
		},
		{
			name: "unreadable stat",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				f := filepath.Join(p.Root, "42", "stat")
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
				if err := os.Mkdir(f, 0o755); err != nil { // reading a directory fails, even as root
					t.Fatal(err)
				}
			},
			err: "read process start",
		},
		{
			name: "btime not a number",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				p.write("stat", "cpu 1 2\nbtime 17e8\n")
			},
			err: `btime "17e8"`,
		},
		{
			name:  "btime zero",
			setup: func(t *testing.T, p *procTree) { p.addProcess(42, "containerd", 1); p.write("stat", "btime 0\n") },
			err:   `btime "0"`,
		},
		{
			name:  "no btime",
			setup: func(t *testing.T, p *procTree) { p.addProcess(42, "containerd", 1); p.write("stat", "cpu 1 2\n") },
			err:   "no btime line",
		},
		{
			name: "btime twice",
			setup: func(t *testing.T, p *procTree) {
				p.addProcess(42, "containerd", 1)
				p.write("stat", "btime 5\nbtime 6\n")
			},
			err: "btime appears twice",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newProcTree(t)
			tt.setup(t, p)
			got, err := Proc{Root: p.Root}.StartTime(42)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("StartTime() error = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("StartTime(): %v", err)
			}
			if !got.Equal(tt.want) {
				t.Fatalf("StartTime() = %v, want %v", got, tt.want)
			}
		})
	}
}

// The real /proc of this machine: this test process started a moment ago, and the tick rate
// read from /proc/self/auxv is the one the Go runtime got from the kernel.
func TestStartTimeRealProc(t *testing.T) {
	t.Parallel()
	p := Proc{Root: "/proc"}
	hz, err := p.ClockTicks()
	if err != nil {
		t.Fatalf("ClockTicks: %v", err)
	}
	auxv, err := unix.Auxv()
	if err != nil {
		t.Fatalf("unix.Auxv: %v", err)
	}
	var want uint64
	for _, kv := range auxv {
		if kv[0] == atClkTck {
			want = uint64(kv[1])
		}
	}
	if hz != want {
		t.Fatalf("ClockTicks() = %d, runtime auxv says %d", hz, want)
	}
	start, err := p.StartTime(os.Getpid())
	if err != nil {
		t.Fatalf("StartTime(self): %v", err)
	}
	now := time.Now()
	if start.After(now.Add(2*time.Second)) || start.Before(now.Add(-10*time.Minute)) {
		t.Fatalf("StartTime(self) = %v, now %v: not within the last 10 minutes", start, now)
	}
	procs, err := p.FindByComm(readComm(t))
	if err != nil {
		t.Fatalf("FindByComm: %v", err)
	}
	found := false
	for _, pr := range procs {
		found = found || pr.PID == os.Getpid()
	}
	if !found {
		t.Fatalf("FindByComm(own comm) = %+v, does not list pid %d", procs, os.Getpid())
	}
}

func readComm(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestFindByComm(t *testing.T) {
	t.Parallel()
	p := newProcTree(t)
	p.addProcess(900, "containerd", ticksAt(testBtime+90), "/usr/bin/containerd")
	p.addProcess(77, "containerd", ticksAt(testBtime+10), "/bin/containerd", "--address", "/system/run/containerd/containerd.sock")
	p.addProcess(120, "containerd-shim", 5, "/usr/bin/containerd-shim-runc-v2")
	p.addProcess(121, "containerd ", 5)
	p.addProcess(5, "crio", ticksAt(testBtime+3))
	p.write("self/comm", "nodecache\n")
	p.write("notapid/comm", "containerd\n")

	got, err := Proc{Root: p.Root}.FindByComm("containerd")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].PID != 77 || got[1].PID != 900 {
		t.Fatalf("FindByComm = %+v, want pids 77 and 900 in order", got)
	}
	if !got[1].Start.Equal(time.Unix(testBtime+90, 0)) {
		t.Fatalf("start of 900 = %v", got[1].Start)
	}

	t.Run("stat of a match unreadable", func(t *testing.T) {
		t.Parallel()
		q := newProcTree(t)
		q.addProcess(10, "containerd", 1)
		q.write("10/stat", "10 (containerd) S 1 2 3\n")
		if _, err := (Proc{Root: q.Root}).FindByComm("containerd"); err == nil {
			t.Fatal("FindByComm with a broken stat of a match: want an error")
		}
	})
	t.Run("comm and stat disagree", func(t *testing.T) {
		t.Parallel()
		q := newProcTree(t)
		q.addProcess(10, "containerd", 1)
		q.write("10/stat", statLine(10, "evil", 1))
		_, err := Proc{Root: q.Root}.FindByComm("containerd")
		if err == nil || !strings.Contains(err.Error(), "stat says") {
			t.Fatalf("FindByComm = %v, want a comm mismatch error", err)
		}
	})
	t.Run("no CLK_TCK is an error only when a process matches", func(t *testing.T) {
		t.Parallel()
		q := newProcTree(t)
		q.addProcess(10, "crio", 1)
		q.writeBytes("self/auxv", EncodeAuxv())
		if got, err := (Proc{Root: q.Root}).FindByComm("containerd"); err != nil || len(got) != 0 {
			t.Fatalf("FindByComm(no match) = %v, %v", got, err)
		}
		if _, err := (Proc{Root: q.Root}).FindByComm("crio"); !errors.Is(err, ErrNoClockTicks) {
			t.Fatalf("FindByComm(match) = %v, want ErrNoClockTicks", err)
		}
	})
}

func TestListensOn(t *testing.T) {
	t.Parallel()
	p := newProcTree(t)
	p.addProcess(77, "containerd", 1, "/bin/containerd", "--address", "/system/run/containerd/containerd.sock")
	p.addProcess(900, "containerd", 2, "/usr/bin/containerd", "--config=/etc/cri/containerd.toml")
	p.listen(77, "/system/run/containerd/containerd.sock", 5001)
	p.listen(900, "/run/containerd/containerd.sock", 6001)
	p.listen(900, "/run/containerd/with space.sock", 6002)
	p.seeSocket(77, "/run/containerd/containerd.sock", 6001) // same netns
	pr := Proc{Root: p.Root}

	tests := []struct {
		pid   int
		path  string
		want  bool
		inode uint64
	}{
		{77, "/run/containerd/containerd.sock", false, 0},
		{900, "/run/containerd/containerd.sock", true, 6001},
		{77, "/system/run/containerd/containerd.sock", true, 5001},
		{900, "/run/containerd/with space.sock", true, 6002},
		{900, "/run/containerd/other.sock", false, 0},
		{4242, "/run/containerd/containerd.sock", false, 0}, // exited between discovery and this check
	}
	for _, tt := range tests {
		got, inode, err := pr.ListensOn(tt.pid, tt.path)
		if err != nil || got != tt.want || inode != tt.inode {
			t.Errorf("ListensOn(%d, %q) = %v, %d, %v; want %v, %d", tt.pid, tt.path, got, inode, err, tt.want, tt.inode)
		}
	}
	args, err := pr.Cmdline(900)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := flagValue(args, "config", "c"); !ok || v != "/etc/cri/containerd.toml" {
		t.Fatalf("flagValue(config) = %q, %v", v, ok)
	}
}

func TestFlagValue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
		ok   bool
	}{
		{[]string{"containerd", "--address", "/a.sock"}, "/a.sock", true},
		{[]string{"containerd", "--address=/a.sock"}, "/a.sock", true},
		{[]string{"containerd", "-a", "/a.sock"}, "/a.sock", true},
		{[]string{"containerd", "-address", "/a.sock"}, "/a.sock", true},
		{[]string{"containerd", "--config", "/c", "-a=/b.sock"}, "/b.sock", true},
		{[]string{"containerd", "--", "--address", "/a.sock"}, "", false},
		{[]string{"containerd", "--addressx", "/a.sock"}, "", false},
		{[]string{"containerd"}, "", false},
	}
	for _, tt := range tests {
		got, ok := flagValue(tt.args, "address", "a")
		if got != tt.want || ok != tt.ok {
			t.Errorf("flagValue(%q) = %q, %v; want %q, %v", tt.args, got, ok, tt.want, tt.ok)
		}
	}
}
