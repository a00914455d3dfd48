package inventory

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// PinListing is `cache pins`'s report: every pin of serve, as GET mirrorapi.CachePinsPath
// answers (loopback and --allow networks).
type PinListing struct {
	mirrorapi.PinList
}

// PinList fetches serve's pins. Errors: those of List (serve not answering at the listen URL,
// not nodecache serve, or refusing).
func (c *Client) PinList(ctx context.Context) (*PinListing, error) {
	l, err := c.Pins(ctx)
	if err != nil {
		return nil, err
	}
	return &PinListing{PinList: *l}, nil
}

// WriteJSON writes the pins as serve answered them.
func (l *PinListing) WriteJSON(w io.Writer) error {
	return writeIndented(w, l.PinList)
}

// WriteText writes one row per pin — what was pinned (UPSTREAM/REPOSITORY:TAG, or @DIGEST), the
// manifest it holds (and the one a moved tag waits for), the bytes it holds, when it was made —
// then the pinned total against the 80% of the cap pins may hold.
func (l *PinListing) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PIN\tHOLDS\tSIZE\tPINNED")
	for _, p := range l.Pins {
		name, holds := p.Upstream+"/"+p.Repository+"@"+p.Digest, "-"
		if p.Tag != "" {
			name, holds = p.Upstream+"/"+p.Repository+":"+p.Tag, p.Digest
			if p.Next != "" {
				holds += " (moving to " + p.Next + ")"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, holds, clitext.Bytes(p.SizeBytes), p.Pinned.Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	limit := "no cap: pins are not limited"
	if l.MaxSizeBytes > 0 {
		limit = fmt.Sprintf("pins may hold at most %s, 80%% of the cap %s", clitext.Bytes(l.MaxSizeBytes*8/10), clitext.Bytes(l.MaxSizeBytes))
	}
	_, err := fmt.Fprintf(w, "%s holding %s; %s\n", clitext.Count(len(l.Pins), "pin"), clitext.Bytes(l.PinnedBytes), limit)
	return err
}

// writeIndented writes v as JSON indented by two spaces, as the reports' --output json does.
func writeIndented(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
