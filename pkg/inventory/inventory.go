// Package inventory is the client of serve's cache inventory (mirrorapi.CachePath): list the
// cached images, evict one. `nodecache cache ls|rm` renders what it returns.
package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// ErrNotCached is returned by Remove when serve does not hold the image (404).
var ErrNotCached = errors.New("not cached")

// ErrInput marks a refused argument (listen URL, image spec).
var ErrInput = errors.New("invalid input")

// Client talks to one serve.
type Client struct {
	base *url.URL
	http *http.Client
}

// New returns a client of the serve reached at listenURL (http://127.0.0.1:5000 or https://...).
// hc nil: a client with a 30 s timeout. Errors wrap ErrInput.
func New(listenURL string, hc *http.Client) (*Client, error) {
	u, err := name.ParseURL("--listen-url", listenURL) // a port out of range is refused here, never dialled
	if err != nil {
		return nil, fmt.Errorf("%w: %w (e.g. http://127.0.0.1:5000)", ErrInput, err)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &Client{base: u, http: hc}, nil
}

// List returns serve's inventory. When nothing answers at the listen URL (a dial error) the
// error says so and asks whether serve runs there: "connect: connection refused: is nodecache
// serve running at http://127.0.0.1:5000? (--listen-url)".
func (c *Client) List(ctx context.Context) (*Listing, error) {
	var inv mirrorapi.CacheInventory
	if err := c.do(ctx, http.MethodGet, mirrorapi.CachePath, &inv); err != nil {
		return nil, err
	}
	return &Listing{CacheInventory: inv}, nil
}

// ParseSpec checks "<upstream>/<repository>@<digest>" and returns it with the digest parsed.
// Errors wrap ErrInput.
func ParseSpec(spec string) (string, error) {
	up, rest, ok1 := strings.Cut(spec, "/")
	repo, d, ok2 := strings.Cut(rest, "@")
	if !ok1 || !ok2 || up == "" || repo == "" {
		return "", fmt.Errorf("%w: %q: want UPSTREAM/REPOSITORY@DIGEST as `nodecache cache ls` lists it, e.g. docker.io/library/alpine@sha256:<64 hex digits>", ErrInput, spec)
	}
	if _, err := digest.Parse(d); err != nil {
		return "", fmt.Errorf("%w: %q: digest %q: %w", ErrInput, spec, d, err)
	}
	return spec, nil
}

// RemoveArgs is Remove of the one spec in args (ErrInput unless there is exactly one). A flag
// given after the spec arrives here as an argument (flags end at the first argument): it is
// named, with where it goes.
func (c *Client) RemoveArgs(ctx context.Context, args []string) (*Removal, error) {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("%w: argument %q looks like a flag: flags go before UPSTREAM/REPOSITORY@DIGEST, e.g. nodecache cache rm --output json docker.io/library/alpine@sha256:<64 hex digits>", ErrInput, a)
		}
	}
	if len(args) != 1 {
		return nil, fmt.Errorf("%w: cache rm takes one UPSTREAM/REPOSITORY@DIGEST (as cache ls lists it), got %d arguments", ErrInput, len(args))
	}
	return c.Remove(ctx, args[0])
}

// Remove evicts the image spec ("<upstream>/<repository>@<digest>"); serve accepts it from
// loopback only. Errors: ErrInput for a bad spec (serve's 400 too: an upstream it does not
// have), ErrNotCached ("not cached: SPEC"), serve's
// refusal or failure; when nothing answers at the listen URL, the error asks whether serve runs
// there (--listen-url), as List's does.
func (c *Client) Remove(ctx context.Context, spec string) (*Removal, error) {
	if _, err := ParseSpec(spec); err != nil {
		return nil, err
	}
	var img mirrorapi.CachedImage
	if err := c.do(ctx, http.MethodDelete, mirrorapi.CachePath+"/"+spec, &img); err != nil {
		return nil, err
	}
	return &Removal{Image: img}, nil
}

func (c *Client) do(ctx context.Context, method, path string, out any) error {
	u := *c.base
	u.Path = path
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u.String(), err)
	}
	resp, err := c.http.Do(req)
	var dial *net.OpError
	if errors.As(err, &dial) && dial.Op == "dial" {
		return fmt.Errorf("%w: is nodecache serve running at %s? (--listen-url)", dial.Err, c.base)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u.String(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, u.String(), err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		if resp.StatusCode == http.StatusBadRequest && method == http.MethodDelete {
			// serve refused the spec (an upstream it does not have): the input, not the cache.
			return fmt.Errorf("%w: %s", ErrInput, msg)
		}
		if resp.StatusCode == http.StatusNotFound && method == http.MethodDelete {
			// serve says "not cached: UPSTREAM/REPOSITORY@DIGEST"; say it once.
			return fmt.Errorf("%w: %s", ErrNotCached, strings.TrimPrefix(msg, ErrNotCached.Error()+": "))
		}
		return fmt.Errorf("%s %s: %s: %s", method, u.String(), resp.Status, msg)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s %s: answer is not the inventory's JSON: %w", method, u.String(), err)
	}
	return nil
}

// Listing is `cache ls`'s report.
type Listing struct{ mirrorapi.CacheInventory }

// WriteJSON writes the inventory document as serve sent it.
func (l *Listing) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(l.CacheInventory)
}

// WriteText writes one line per image (IMAGE, TAGS, SIZE, LAST PULLED; a tag of a child manifest
// is marked "(child)"), then the totals.
func (l *Listing) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tTAGS\tSIZE\tLAST PULLED")
	for _, i := range l.Images {
		names := slices.Clone(i.Tags)
		for _, t := range slices.Sorted(maps.Keys(i.ChildTags)) {
			names = append(names, t+"(child)") // a tag has no "(": the mark cannot be misread
		}
		tags := strings.Join(names, ",")
		if tags == "" {
			tags = "-"
		}
		fmt.Fprintf(tw, "%s/%s@%s\t%s\t%s\t%s\n", i.Upstream, i.Repository, i.Digest, tags, clitext.Bytes(i.SizeBytes), i.LastPulled.Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	limit := "no cap"
	if l.MaxSizeBytes > 0 {
		limit = "cap " + clitext.Bytes(l.MaxSizeBytes)
	}
	note := ""
	if !l.Ready {
		note = " (index being rebuilt from storage: images may be missing)"
	}
	_, err := fmt.Fprintf(w, "%d images, %d blobs, %s (%s)%s\n", len(l.Images), l.Blobs, clitext.Bytes(l.SizeBytes), limit, note)
	return err
}

// Removal is `cache rm`'s report.
type Removal struct{ Image mirrorapi.CachedImage }

// WriteJSON writes the evicted image.
func (r *Removal) WriteJSON(w io.Writer) error { return json.NewEncoder(w).Encode(r.Image) }

// WriteText writes one line naming the evicted image.
func (r *Removal) WriteText(w io.Writer) error {
	_, err := fmt.Fprintf(w, "evicted %s/%s@%s (%s)\n", r.Image.Upstream, r.Image.Repository, r.Image.Digest, clitext.Bytes(r.Image.SizeBytes))
	return err
}
