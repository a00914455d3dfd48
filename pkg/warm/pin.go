package warm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// ErrNotNodecache is Run's error with Options.Pin when the mirror is not a nodecache serve (its
// GET /v2/ answer has no mirrorapi.HeaderVersion header): only nodecache keeps pins.
var ErrNotNodecache = errors.New("--pin needs nodecache serve as the mirror")

// pinTimeout bounds one attempt at a pin request (serve answers it from its index).
const pinTimeout = 30 * time.Second

// pinSpec is what ref is pinned by, as mirrorapi.CachePinsPath takes it:
// "<registry>/<repository>:<tag>" (the pin then follows the tag), or "…@<digest>" when the
// reference names a digest (which wins over its tag, as it does for the walk).
func pinSpec(ref Reference) string {
	if ref.Digest != "" {
		return ref.Registry + "/" + ref.Repository + "@" + ref.Digest.String()
	}
	return ref.Registry + "/" + ref.Repository + ":" + ref.Tag
}

// pin asks the mirror to pin ref (PUT mirrorapi.CachePinsPath/<pinSpec>), with retries on 5xx
// (serve answers 503 while its cache index is loaded), 429, 408 and network errors; a refusal
// (400, 403 outside serve's --allow, 404 not cached, 409 over 80% of --max-size) is not retried
// and its error carries serve's message.
func (c *client) pin(ctx context.Context, ref Reference) (mirrorapi.Pin, error) {
	u := *c.base
	u.Path, u.RawQuery = mirrorapi.CachePinsPath+"/"+pinSpec(ref), ""
	target := u.String()
	var p mirrorapi.Pin
	err := c.retry(ctx, "pin "+pinSpec(ref), func(ctx context.Context, _ int) error {
		actx, cancel := context.WithTimeout(ctx, pinTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(actx, http.MethodPut, target, nil)
		if err != nil {
			return permanent(fmt.Errorf("build request %s: %w", target, err))
		}
		req.Header.Set("User-Agent", c.userAgent)
		resp, err := c.hc.Do(req)
		if err != nil {
			return fmt.Errorf("PUT %s: %w", target, err)
		}
		if resp.StatusCode != http.StatusOK {
			se := newStatusError(resp)
			se.Method = http.MethodPut
			var body struct {
				Error string `json:"error"`
			}
			if json.Unmarshal([]byte(se.Body), &body) == nil && body.Error != "" {
				se.Body = body.Error
			}
			if retryable(ctx, se) {
				return se
			}
			return permanent(fmt.Errorf("serve refused the pin (%d %s): %s", se.Status, http.StatusText(se.Status), strings.TrimSpace(se.Body)))
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&p); err != nil {
			return permanent(fmt.Errorf("PUT %s: answer is not a pin: %w", target, err))
		}
		return nil
	})
	return p, err
}

// pinImage pins ref once it is warm (Options.Pin) and records the outcome in out: Pinned, or
// an Error saying the image is warm but not pinned.
func (w *walker) pinImage(ctx context.Context, ref Reference, out *ImageReport) {
	p, err := w.c.pin(ctx, ref)
	if err != nil {
		out.Error = "warm, but not pinned: " + describe(ctx, err)
		return
	}
	out.Pinned = true
	if p.Digest != "" && out.Digest != "" && p.Digest != out.Digest && p.Next != out.Digest {
		// The tag moved again between the walk and the pin: the pin holds what serve's tag
		// names now, and follows it.
		out.Note = strings.TrimPrefix(out.Note+"; ", "; ") + "pinned " + p.Digest + ", which the tag names at serve now"
	}
}
