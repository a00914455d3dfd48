package crio

import (
	"fmt"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/bootstrap"
)

// ReloadResult records the best-effort SIGHUP. A delivered signal proves nothing: CRI-O reloads
// later and may reject the files, so this is never activation evidence (crio.conf(5): SIGHUP
// reloads containers-registries.conf; docs/contracts.md, "Status verdicts").
type ReloadResult struct {
	// Skipped says why no signal was sent (--no-reload, --dry-run, nothing changed, no process).
	Skipped string `json:"skipped,omitempty"`
	// PIDs are the processes named exactly "crio" that were signalled.
	PIDs []int `json:"pids,omitempty"`
	// Error is the signal error, if any.
	Error string `json:"error,omitempty"`
}

// Reload sends one SIGHUP to each process named exactly "crio" in the host's process table
// (h's proc root: this process's pid namespace, so a pod needs hostPID). Failures are recorded,
// not returned: the drop-in is in place either way and auto_reload_registries or the next start
// picks it up. Its log lines are debug lines: the caller reports the result (gen's report, the
// agent's summary line), so that it is told once.
func Reload(h *bootstrap.Host, log zerolog.Logger) ReloadResult {
	procs, err := h.Processes("crio")
	if err != nil {
		return ReloadResult{Skipped: fmt.Sprintf("list processes: %v", err)}
	}
	var res ReloadResult
	for _, p := range procs {
		if err := syscall.Kill(p.PID, syscall.SIGHUP); err != nil {
			res.Error = fmt.Sprintf("SIGHUP to crio pid %d: %v", p.PID, err)
			log.Debug().Int("pid", p.PID).Err(err).Msg("SIGHUP to crio failed")
			continue
		}
		res.PIDs = append(res.PIDs, p.PID)
		log.Debug().Int("pid", p.PID).Msg("sent SIGHUP to crio to reload registries (best effort; not activation evidence)")
	}
	if len(res.PIDs) == 0 && res.Error == "" {
		res.Skipped = "no process named crio"
	}
	return res
}
