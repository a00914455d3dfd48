package bootstrap_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
)

var testBoot = time.Date(2026, 3, 4, 5, 6, 7, 123_456_789, time.UTC)

// A start time is the injected boot time (nanoseconds kept) plus starttime ÷ CLK_TCK.
func TestProcessStart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, p *bootstraptest.ProcTree)
		want  time.Time
		err   string
	}{
		{
			name:  "whole and fractional ticks",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) { p.AddProcessTicks(42, "containerd", 12345) },
			want:  testBoot.Add(123*time.Second + 450*time.Millisecond),
		},
		{
			name:  "comm with spaces and parentheses",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) { p.AddProcessTicks(42, "x) 1 2 (y", 500) },
			want:  testBoot.Add(5 * time.Second),
		},
		{
			name: "250 Hz",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) {
				p.AddProcessTicks(42, "containerd", 1001)
				p.WriteBytes("self/auxv", bootstrap.EncodeAuxv([2]uint64{17, 250}))
			},
			want: testBoot.Add(4*time.Second + 4*time.Millisecond),
		},
		{
			name: "non-digit starttime",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) {
				p.AddProcessTicks(42, "containerd", 1)
				p.Write("42/stat", strings.Replace(bootstraptest.StatLine(42, "containerd", 1), " 1 0 0 0", " 1x 0 0 0", 1))
			},
			err: "read process 42 start",
		},
		{
			name: "truncated stat",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) {
				p.AddProcessTicks(42, "containerd", 1)
				p.Write("42/stat", "42 (containerd) S 1 2 3\n")
			},
			err: "read process 42 start",
		},
		{
			name: "missing CLK_TCK",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) {
				p.AddProcessTicks(42, "containerd", 1)
				p.WriteBytes("self/auxv", bootstrap.EncodeAuxv([2]uint64{6, 4096}))
			},
			err: bootstrap.ErrNoClockTicks.Error(),
		},
		{
			name: "zero CLK_TCK",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) {
				p.AddProcessTicks(42, "containerd", 1)
				p.WriteBytes("self/auxv", bootstrap.EncodeAuxv([2]uint64{17, 0}))
			},
			err: bootstrap.ErrNoClockTicks.Error(),
		},
		{
			name: "CLK_TCK after AT_NULL does not count",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) {
				p.AddProcessTicks(42, "containerd", 1)
				p.WriteBytes("self/auxv", append(bootstrap.EncodeAuxv(), bootstrap.EncodeAuxv([2]uint64{17, 100})...))
			},
			err: bootstrap.ErrNoClockTicks.Error(),
		},
		{
			name: "torn auxv",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) {
				p.AddProcessTicks(42, "containerd", 1)
				p.WriteBytes("self/auxv", bootstrap.EncodeAuxv([2]uint64{17, 100})[:5])
			},
			err: "not a whole number",
		},
		{
			name: "no auxv",
			setup: func(t *testing.T, p *bootstraptest.ProcTree) {
				p.AddProcessTicks(42, "containerd", 1)
				if err := os.Remove(filepath.Join(p.Root, "self", "auxv")); err != nil {
					t.Fatal(err)
				}
			},
			err: "read clock tick rate",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := bootstraptest.NewProcTree(t, testBoot)
			tt.setup(t, p)
			got, err := p.Host(t.TempDir()).Process(42)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Process() error = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Process(): %v", err)
			}
			if !got.Start.Equal(tt.want) {
				t.Fatalf("Process().Start = %v, want %v", got.Start, tt.want)
			}
		})
	}
}

// The boot time source is injected: a failing one is an error naming it.
func TestProcessBootTimeError(t *testing.T) {
	t.Parallel()
	p := bootstraptest.NewProcTree(t, testBoot)
	p.AddProcessTicks(42, "containerd", 1)
	h, err := bootstrap.NewHost(bootstrap.HostOptions{Root: t.TempDir(), ProcRoot: p.Root,
		BootTime: func() (time.Time, error) { return time.Time{}, errors.New("no clock") }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Processes("containerd"); err == nil || !strings.Contains(err.Error(), "read boot time: no clock") {
		t.Fatalf("Processes() = %v, want the boot time error", err)
	}
}

// The real /proc of this machine: this test process started a moment ago (to one tick, with
// the boot time from the clocks), and the tick rate read from /proc/self/auxv is the one the Go
// runtime got from the kernel.
func TestProcessRealProc(t *testing.T) {
	t.Parallel()
	h, err := bootstrap.NewHost(bootstrap.HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hz, err := h.ClockTicks()
	if err != nil {
		t.Fatalf("ClockTicks: %v", err)
	}
	auxv, err := unix.Auxv()
	if err != nil {
		t.Fatalf("unix.Auxv: %v", err)
	}
	var want uint64
	for _, kv := range auxv {
		if kv[0] == 17 {
			want = uint64(kv[1])
		}
	}
	if hz != want {
		t.Fatalf("ClockTicks() = %d, runtime auxv says %d", hz, want)
	}
	self, err := h.Process(os.Getpid())
	if err != nil {
		t.Fatalf("Process(self): %v", err)
	}
	now := time.Now()
	if self.Start.After(now) || self.Start.Before(now.Add(-10*time.Minute)) {
		t.Fatalf("Process(self).Start = %v, now %v: not within the last 10 minutes", self.Start, now)
	}
	// A child started now: its start time is within a tick (plus scheduling) of the wall clock.
	before := time.Now()
	cmd := newSleeper(t)
	after := time.Now()
	child, err := h.Process(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if child.Start.Before(before.Add(-child.Tick-2*time.Millisecond)) || child.Start.After(after.Add(2*time.Millisecond)) {
		t.Fatalf("child start %s, launched between %s and %s (tick %s): boot time not precise", child.Start, before, after, child.Tick)
	}
	procs, err := h.Processes(child.Comm)
	if err != nil {
		t.Fatalf("Processes: %v", err)
	}
	found := false
	for _, pr := range procs {
		found = found || pr.PID == child.PID
	}
	if !found {
		t.Fatalf("Processes(%q) = %+v, does not list pid %d", child.Comm, procs, child.PID)
	}
}

func TestProcesses(t *testing.T) {
	t.Parallel()
	p := bootstraptest.NewProcTree(t, testBoot)
	p.AddProcess(900, "containerd", testBoot.Add(90*time.Second+30*time.Millisecond), "/usr/bin/containerd")
	p.AddProcess(77, "containerd", testBoot.Add(10*time.Second), "/bin/containerd", "--address", "/system/run/containerd/containerd.sock")
	p.AddProcessTicks(120, "containerd-shim", 5, "/usr/bin/containerd-shim-runc-v2")
	p.AddProcessTicks(121, "containerd ", 5)
	p.AddProcessTicks(5, "crio", 300)
	p.Write("notapid/comm", "containerd\n")
	h := p.Host(t.TempDir())

	got, err := h.Processes("containerd")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].PID != 77 || got[1].PID != 900 {
		t.Fatalf("Processes = %+v, want pids 77 and 900 in order", got)
	}
	if want := testBoot.Add(90*time.Second + 30*time.Millisecond); !got[1].Start.Equal(want) || got[1].Tick != 10*time.Millisecond {
		t.Fatalf("start of 900 = %v (tick %v), want %v (10ms)", got[1].Start, got[1].Tick, want)
	}

	t.Run("comm and stat disagree", func(t *testing.T) {
		t.Parallel()
		q := bootstraptest.NewProcTree(t, testBoot)
		q.AddProcessTicks(10, "containerd", 1)
		q.Write("10/stat", bootstraptest.StatLine(10, "evil", 1))
		_, err := q.Host(t.TempDir()).Processes("containerd")
		if err == nil || !strings.Contains(err.Error(), "stat says") {
			t.Fatalf("Processes = %v, want a comm mismatch error", err)
		}
	})
	t.Run("no CLK_TCK is an error only when a process matches", func(t *testing.T) {
		t.Parallel()
		q := bootstraptest.NewProcTree(t, testBoot)
		q.AddProcessTicks(10, "crio", 1)
		q.WriteBytes("self/auxv", bootstrap.EncodeAuxv())
		h := q.Host(t.TempDir())
		if got, err := h.Processes("containerd"); err != nil || len(got) != 0 {
			t.Fatalf("Processes(no match) = %v, %v", got, err)
		}
		if _, err := h.Processes("crio"); !errors.Is(err, bootstrap.ErrNoClockTicks) {
			t.Fatalf("Processes(match) = %v, want ErrNoClockTicks", err)
		}
	})
}

func TestListensOn(t *testing.T) {
	t.Parallel()
	p := bootstraptest.NewProcTree(t, testBoot)
	p.AddProcessTicks(77, "containerd", 1, "/bin/containerd", "--address", "/system/run/containerd/containerd.sock")
	p.AddProcessTicks(900, "containerd", 2, "/usr/bin/containerd", "--config=/etc/cri/containerd.toml")
	p.Listen(77, "/system/run/containerd/containerd.sock", 5001)
	p.Listen(900, "/run/containerd/containerd.sock", 6001)
	p.Listen(900, "/run/containerd/with space.sock", 6002)
	p.SeeSocket(77, "/run/containerd/containerd.sock", 6001) // same netns
	h := p.Host(t.TempDir())

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
		got, inode, err := h.ListensOn(tt.pid, tt.path)
		if err != nil || got != tt.want || inode != tt.inode {
			t.Errorf("ListensOn(%d, %q) = %v, %d, %v; want %v, %d", tt.pid, tt.path, got, inode, err, tt.want, tt.inode)
		}
	}
	args, err := h.Cmdline(900)
	if err != nil || len(args) != 2 || args[1] != "--config=/etc/cri/containerd.toml" {
		t.Fatalf("Cmdline(900) = %q, %v", args, err)
	}
}

func newSleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleep: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}
