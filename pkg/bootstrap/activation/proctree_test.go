package activation

import (
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
)

// procTree is bootstraptest.ProcTree with the boot time and tick rate these tests count from.
type procTree struct {
	*bootstraptest.ProcTree
}

const (
	testBtime = int64(1_700_000_000)
	testHz    = uint64(100)
)

func newProcTree(t *testing.T) *procTree {
	t.Helper()
	return &procTree{bootstraptest.NewProcTree(t, time.Unix(testBtime, 0))}
}

func (p *procTree) write(rel, content string) { p.Write(rel, content) }

var statLine = bootstraptest.StatLine

// addProcess adds pid with comm, started startTicks clock ticks after boot, and its arguments.
func (p *procTree) addProcess(pid int, comm string, startTicks uint64, args ...string) {
	p.AddProcessTicks(pid, comm, startTicks, args...)
}

func (p *procTree) listen(pid int, path string, inode uint64)    { p.Listen(pid, path, inode) }
func (p *procTree) seeSocket(pid int, path string, inode uint64) { p.SeeSocket(pid, path, inode) }

// ticksAt returns the starttime value of a process started at unix second sec.
func ticksAt(sec int64) uint64 { return uint64(sec-testBtime) * testHz }
