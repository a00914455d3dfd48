package bootstrap

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// BackupSuffix names the copy of a user's file taken before nodecache first edits it:
// <file>.nodecache.bak, written once and never overwritten.
const BackupSuffix = ".nodecache.bak"

// Action is what applying a Change does to its path.
type Action string

// Actions, as shown in text and JSON output.
const (
	ActionCreate    Action = "create"    // the file does not exist yet
	ActionUpdate    Action = "update"    // replace the file's bytes (a backup first for a user's file)
	ActionUnchanged Action = "unchanged" // bytes already as wanted: nothing is written
	ActionRemove    Action = "remove"    // delete a file nodecache owns
	ActionRestore   Action = "restore"   // move Backup back over Path
)

// Change is one planned file operation, as data: a Plan function returns them and Apply performs
// them. Paths are host paths (absolute, without the --host-root prefix).
type Change struct {
	// Path is the host path of the file, without symbolic links once ResolveChanges ran.
	Path string `json:"path"`
	// Via is the path as planned when it reaches Path through symbolic links (e.g. a
	// config.toml that links elsewhere); the links themselves are never changed. Empty otherwise.
	Via string `json:"via,omitempty"`
	// Action says what happens to it.
	Action Action `json:"action"`
	// Mode is the permission of a created file; an updated file keeps its own.
	Mode fs.FileMode `json:"-"`
	// Old is the file's current content (nil when it does not exist). Apply refuses to act when
	// the file no longer has these bytes.
	Old []byte `json:"-"`
	// New is the wanted content (create, update); nil for remove and restore.
	New []byte `json:"-"`
	// Backup is, for an update of a user's file, where its original is saved before the first
	// edit (only if that file does not exist yet); for a restore, the backup moved back.
	Backup string `json:"backup,omitempty"`
	// PruneDir removes the file's directory after a remove when it is then empty.
	PruneDir bool `json:"-"`
	// Note explains the change in one line (shown in text output).
	Note string `json:"note,omitempty"`
}

// Changed reports whether applying c writes or removes anything.
func (c Change) Changed() bool { return c.Action != ActionUnchanged }

// FSName turns an absolute host path into a name for an fs.FS rooted at the host root:
// "/etc/containerd/config.toml" -> "etc/containerd/config.toml". Relative paths are taken as
// relative to "/".
func FSName(p string) string {
	n := strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(p)), "/")
	if n == "" {
		return "."
	}
	return n
}

// ReadFile reads a host path through fsys; a missing file returns (nil, false, nil). Only a
// regular file of at most inputfile.RuntimeConfig.Limit bytes is read: another type (a FIFO, a
// device, a directory) or a larger file is refused (ErrRefused) naming p.
func ReadFile(fsys fs.FS, p string) (data []byte, exists bool, err error) {
	data, err = inputfile.ReadFS(fsys, FSName(p), p, inputfile.RuntimeConfig)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, false, nil
	case inputfile.Refused(err):
		return nil, false, err
	case err != nil:
		return nil, false, fmt.Errorf("read %s: %w", p, err)
	}
	return data, true, nil
}

// PlanOwned plans a file nodecache owns: data must start with mirrorapi.ManagedMarker. An existing file at p
// that does not start with mirrorapi.ManagedMarker is refused (ErrRefused): it belongs to someone else.
func PlanOwned(fsys fs.FS, p string, mode fs.FileMode, data []byte) (Change, error) {
	if !mirrorapi.Managed(data) {
		return Change{}, fmt.Errorf("plan %s: generated content lacks the %q first line", p, mirrorapi.ManagedMarker)
	}
	old, exists, err := ReadFile(fsys, p)
	if err != nil {
		return Change{}, err
	}
	c := Change{Path: p, Mode: mode, Old: old, New: data}
	switch {
	case !exists:
		c.Action = ActionCreate
	case bytes.Equal(old, data):
		c.Action = ActionUnchanged
	case !mirrorapi.Managed(old):
		return Change{}, refusal.Errorf("%s exists and is not managed by nodecache (its first line is not %q): move it away or merge it by hand", p, mirrorapi.ManagedMarker)
	default:
		c.Action = ActionUpdate
	}
	return c, nil
}

// PlanEdit plans new content for a user's file whose current content is old: an update with a
// backup at p+BackupSuffix (written only when absent), or unchanged.
func PlanEdit(p string, old, data []byte) Change {
	c := Change{Path: p, Old: old, New: data, Mode: 0o644}
	switch {
	case old == nil:
		c.Action = ActionCreate
	case bytes.Equal(old, data):
		c.Action = ActionUnchanged
	default:
		c.Action = ActionUpdate
		c.Backup = p + BackupSuffix
	}
	return c
}

// PlanRemoveOwned plans the removal of p if it exists and is managed by nodecache. ok is false
// when there is nothing to remove; a file that exists but is not ours is reported in note.
func PlanRemoveOwned(fsys fs.FS, p string, pruneDir bool) (c Change, ok bool, note string, err error) {
	old, exists, err := ReadFile(fsys, p)
	if err != nil || !exists {
		return Change{}, false, "", err
	}
	if !mirrorapi.Managed(old) {
		return Change{}, false, fmt.Sprintf("%s is not managed by nodecache: left as it is", p), nil
	}
	return Change{Path: p, Action: ActionRemove, Old: old, PruneDir: pruneDir}, true, "", nil
}

// AnyChanged reports whether any change writes or removes something.
func AnyChanged(cs []Change) bool {
	for _, c := range cs {
		if c.Changed() {
			return true
		}
	}
	return false
}
