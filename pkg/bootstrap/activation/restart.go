package activation

import (
	"fmt"
	"time"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// The restart-evidence rule, the one gen's restart_required and status both use: a daemon has
// read a configuration file when it started after the file's last change. Start times come from
// /proc/<pid>/stat's starttime (clock ticks after boot) plus the boot time as CLOCK_REALTIME −
// CLOCK_BOOTTIME (bootstrap.ClockBootTime), so they are exact to one clock tick; file times come
// from the kernel's coarse clock. The order is therefore unknown only when the change and the
// start are less than StartTolerance apart. A wall-clock step between the write and the start
// moves either side and is a documented limit.

// StartTolerance is the window around a daemon's start in which the order of a file change and
// the start cannot be told: one clock tick of starttime (10 ms at USER_HZ 100), which also
// covers the coarse clock of file times (one jiffy, at most 10 ms at HZ 100).
const StartTolerance = 10 * time.Millisecond

// Order is how a daemon's start and a file's last change relate.
type Order int

// Orders.
const (
	// Loaded: the daemon started at least StartTolerance after the change; it read the file.
	Loaded Order = iota + 1
	// ChangedAfter: the file changed at least StartTolerance after the daemon started; the
	// daemon has not read this version.
	ChangedAfter
	// Ambiguous: start − StartTolerance < mtime < start + StartTolerance.
	Ambiguous
)

// StartOrder applies the rule to a daemon that started at start and a file last modified at
// mtime.
func StartOrder(start, mtime time.Time) Order {
	switch {
	case !mtime.After(start.Add(-StartTolerance)):
		return Loaded
	case !mtime.Before(start.Add(StartTolerance)):
		return ChangedAfter
	default:
		return Ambiguous
	}
}

// String names the order as reports print it.
func (o Order) String() string {
	switch o {
	case Loaded:
		return "loaded"
	case ChangedAfter:
		return "changed-after-start"
	case Ambiguous:
		return "ambiguous"
	}
	return "unknown"
}

// RestartEvidence is the rule applied to a running daemon and the newest file of its
// configuration.
type RestartEvidence struct {
	Order Order
	// Daemon is the process judged.
	Daemon bootstrap.Process
	// File is the newest file of the configuration (host path) and ModTime its last change.
	File    string
	ModTime time.Time
}

// Judge applies the rule to daemon and the newest of files (host path → last change); nil when
// files is empty.
func Judge(daemon bootstrap.Process, files map[string]time.Time) *RestartEvidence {
	var ev *RestartEvidence
	for f, m := range files {
		if ev == nil || m.After(ev.ModTime) || (m.Equal(ev.ModTime) && f < ev.File) {
			ev = &RestartEvidence{File: f, ModTime: m}
		}
	}
	if ev != nil {
		ev.Daemon = daemon
		ev.Order = StartOrder(daemon.Start, ev.ModTime)
	}
	return ev
}

// RestartRequired reports whether the daemon must restart to read the files: the file changed
// after it started, or too close to its start to tell (counted as not read).
func (r *RestartEvidence) RestartRequired() bool { return r != nil && r.Order != Loaded }

// Reason says what the rule found, in one clause: "<daemon> started <t>, after <file> last
// changed (<t>)", "... before ...", or "... within 10ms of ...: cannot tell which came first".
func (r *RestartEvidence) Reason(daemon string) string {
	start, mt := fmtPrecise(r.Daemon.Start), fmtPrecise(r.ModTime)
	switch r.Order {
	case Loaded:
		return fmt.Sprintf("%s started %s, after %s last changed (%s)", daemon, start, r.File, mt)
	case ChangedAfter:
		return fmt.Sprintf("%s started %s, before %s last changed (%s)", daemon, start, r.File, mt)
	}
	return fmt.Sprintf("%s started %s, within %s of the last change of %s (%s): cannot tell which came first", daemon, start, StartTolerance, r.File, mt)
}

// ContainerdRestart applies the rule to the containerd serving socket (found as status finds
// it, see FindContainerd) and the newest file of its configuration eff (config.toml and its
// imports). nil without error when no containerd process runs or there is no config file.
func ContainerdRestart(h *bootstrap.Host, eff *bcontainerd.Effective, socket string) (*RestartEvidence, error) {
	if eff == nil || len(eff.Files) == 0 {
		return nil, nil
	}
	d, err := FindContainerd(h, socket)
	if err != nil || d == nil {
		return nil, err
	}
	return Judge(d.Process, configTimes(eff)), nil
}

func configTimes(eff *bcontainerd.Effective) map[string]time.Time {
	files := map[string]time.Time{}
	for _, f := range eff.Files {
		files[f.Path] = f.ModTime
	}
	return files
}

// fmtPrecise prints a time in UTC with milliseconds: the rule's precision.
func fmtPrecise(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }
