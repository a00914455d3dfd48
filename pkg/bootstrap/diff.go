package bootstrap

import (
	"fmt"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/textdiff"
)

// Diff renders the changes as one unified diff (--dry-run): "--- a<path>" / "+++ b<path>"
// headers, /dev/null for a created or removed file. Unchanged entries contribute nothing; a
// restore is shown as the file going back to its backup's content (backup given as New).
func Diff(changes []Change) (string, error) {
	var sb strings.Builder
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		from, to := "a"+c.Path, "b"+c.Path
		switch c.Action {
		case ActionCreate:
			from = "/dev/null"
		case ActionRemove:
			to = "/dev/null"
		}
		d, err := textdiff.DiffWithCustomPaths(string(c.Old), string(c.New), from, to)
		if err != nil {
			return "", fmt.Errorf("diff %s: %w", c.Path, err)
		}
		sb.WriteString(d)
		if d != "" && !strings.HasSuffix(d, "\n") {
			sb.WriteString("\n")
		}
	}
	return sb.String(), nil
}
