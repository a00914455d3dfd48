package crio

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/rs/zerolog"
)

// ReloadResult records the best-effort SIGHUP. A delivered signal proves nothing: CRI-O reloads
// later and may reject the files, so this is never activation evidence (DESIGN.md, CRI-O facts).
type ReloadResult struct {
	// Skipped says why no signal was sent (--no-reload, --dry-run, nothing changed, no process).
	Skipped string `json:"skipped,omitempty"`
	// PIDs are the processes named exactly "crio" that were signalled.
	PIDs []int `json:"pids,omitempty"`
	// Error is the signal error, if any.
	Error string `json:"error,omitempty"`
}

// Reload sends one SIGHUP to each process whose /proc/<pid>/comm is exactly "crio" under
// procRoot (default "/proc"; the host's process table, so it needs the host PID namespace in a
// pod). Failures are recorded, not returned: the drop-in is in place either way and
// auto_reload_registries or the next start picks it up.
func Reload(procRoot string, log zerolog.Logger) ReloadResult {
	if procRoot == "" {
		procRoot = "/proc"
	}
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return ReloadResult{Skipped: fmt.Sprintf("read %s: %v", procRoot, err)}
	}
	var res ReloadResult
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "comm"))
		if err != nil || !bytes.Equal(bytes.TrimSuffix(comm, []byte("\n")), []byte("crio")) {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			res.Error = fmt.Sprintf("SIGHUP to crio pid %d: %v", pid, err)
			log.Warn().Int("pid", pid).Err(err).Msg("SIGHUP to crio failed")
			continue
		}
		res.PIDs = append(res.PIDs, pid)
		log.Info().Int("pid", pid).Msg("sent SIGHUP to crio to reload registries (best effort; not activation evidence)")
	}
	if len(res.PIDs) == 0 && res.Error == "" {
		res.Skipped = "no process named crio"
	}
	return res
}
