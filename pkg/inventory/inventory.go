// Package inventory is the client of serve's cache inventory (mirrorapi.CachePath): list the
// cached images, evict one, run a verify pass over the stored blobs, pin and unpin images
// (mirrorapi.CachePinsPath), import a bundle of images. `nodecache cache
// ls|rm|verify|pin|unpin|import` renders what it returns, and `nodecache warm --pin` pins
// through it.
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
	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// ErrNotCached is returned by Remove when serve does not hold the image (404).
var ErrNotCached = errors.New("not cached")

// ErrInput marks a refused argument (listen URL, image spec).
var ErrInput = errors.New("invalid input")

// ErrNotPinned is returned by Unpin when serve holds no pin of that tag or digest (404).
var ErrNotPinned = errors.New("not pinned")

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

// ParseSpec checks what `cache rm` takes, "<upstream>/<repository>@<digest>" or
// "<upstream>/<repository>:<tag>" (a tag `cache ls` shows), and returns it. Errors wrap
// ErrInput.
func ParseSpec(spec string) (string, error) {
	return parseImageSpec(spec, "want UPSTREAM/REPOSITORY@DIGEST or UPSTREAM/REPOSITORY:TAG as `nodecache cache ls` lists it, e.g. docker.io/library/alpine@sha256:<64 hex digits> or docker.io/library/alpine:3.20")
}

// parseImageSpec checks "<upstream>/<repository>@<digest>" or "<upstream>/<repository>:<tag>"
// and returns it; want (what is accepted, with examples) ends every error, which wraps ErrInput.
func parseImageSpec(spec, want string) (string, error) {
	up, rest, ok := strings.Cut(spec, "/")
	if !ok || up == "" || rest == "" {
		return "", fmt.Errorf("%w: %q: %s", ErrInput, spec, want)
	}
	if repo, d, found := strings.Cut(rest, "@"); found {
		if repo == "" {
			return "", fmt.Errorf("%w: %q: no repository: %s", ErrInput, spec, want)
		}
		if _, err := digest.Parse(d); err != nil {
			return "", fmt.Errorf("%w: %q: digest %q: %w; %s", ErrInput, spec, d, err, want)
		}
		return spec, nil
	}
	i := strings.LastIndex(rest, ":")
	if i <= 0 || i == len(rest)-1 || strings.Contains(rest[i:], "/") {
		return "", fmt.Errorf("%w: %q: no tag or digest: %s", ErrInput, spec, want)
	}
	return spec, nil
}

// RemoveArgs is Remove of the one spec in args (ErrInput unless there is exactly one). A flag
// given after the spec arrives here as an argument (flags end at the first argument): it is
// named, with where it goes.
func (c *Client) RemoveArgs(ctx context.Context, args []string) (*Removal, error) {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("%w: argument %q looks like a flag: flags go before UPSTREAM/REPOSITORY@DIGEST (or :TAG), e.g. nodecache cache rm --output json docker.io/library/alpine:3.20", ErrInput, a)
		}
	}
	if len(args) != 1 {
		return nil, fmt.Errorf("%w: cache rm takes one UPSTREAM/REPOSITORY@DIGEST or UPSTREAM/REPOSITORY:TAG (as cache ls lists it), got %s", ErrInput, clitext.Count(len(args), "argument"))
	}
	return c.Remove(ctx, args[0])
}

// Remove evicts the image spec ("<upstream>/<repository>@<digest>", or ":<tag>" with a tag of
// an image's row); serve accepts it from loopback only. Errors: ErrInput for a bad spec
// (serve's 400 too: an upstream it does not have), ErrNotCached ("not cached: SPEC"), serve's
// refusal (a pinned image; a child manifest of a cached index, naming the index) or failure; when nothing answers at the listen URL, the error asks whether serve runs
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
	return c.send(ctx, c.http, method, path, "", nil, out)
}

// send is do with a request body of contentType (none when reqBody is nil), through hc.
func (c *Client) send(ctx context.Context, hc *http.Client, method, path, contentType string, reqBody io.Reader, out any) error {
	u := *c.base
	u.Path, u.RawQuery, _ = strings.Cut(path, "?")
	req, err := http.NewRequestWithContext(ctx, method, u.String(), reqBody)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u.String(), err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := hc.Do(req)
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
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		} else {
			// serve answers every error of its API with {"error": …}: this is something else.
			return fmt.Errorf("%s %s: %s (%.80q): what answers at %s is not nodecache serve's cache API; --listen-url takes the address serve listens on (its --listen), e.g. http://127.0.0.1:5000", method, u.String(), resp.Status, msg, c.base)
		}
		if resp.StatusCode == http.StatusBadRequest && method != http.MethodGet {
			// serve refused the spec (an upstream it does not have) or the verify rate: the
			// input, not the cache.
			return fmt.Errorf("%w: %s", ErrInput, msg)
		}
		if resp.StatusCode == http.StatusUnprocessableEntity {
			// serve found a blob of an import damaged or missing: nothing was stored.
			return fmt.Errorf("%w: %s", bundle.ErrDamaged, msg)
		}
		pins := strings.HasPrefix(path, mirrorapi.CachePinsPath+"/")
		switch {
		case resp.StatusCode == http.StatusNotFound && pins && method == http.MethodDelete:
			return fmt.Errorf("%w: %s", ErrNotPinned, strings.TrimPrefix(msg, ErrNotPinned.Error()+": "))
		case resp.StatusCode == http.StatusNotFound && (method == http.MethodDelete || pins):
			// serve says "not cached: UPSTREAM/REPOSITORY@DIGEST"; say it once.
			return fmt.Errorf("%w: %s", ErrNotCached, strings.TrimPrefix(msg, ErrNotCached.Error()+": "))
		case resp.StatusCode == http.StatusConflict:
			// A pin over the pinned share of the cap, a removal of a pinned image: serve's
			// message says why and what to do.
			return errors.New(msg)
		}
		return fmt.Errorf("%s %s: %s: %s", method, u.String(), resp.Status, msg)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s %s: answer is not the inventory's JSON: %w", method, u.String(), err)
	}
	return nil
}

// CommandFlags are the flags of the `nodecache cache` subcommands that take more than
// --listen-url and --output.
type CommandFlags struct {
	// Rate is verify's --rate (empty: serve's --scrub-rate).
	Rate string
	// Ref is import's --ref (empty: the bundle names its images).
	Ref string
}

// Command runs `nodecache cache NAME` (ls, rm, verify, pin, unpin, pins, import) with its
// arguments args (ls, verify and pins take none and ignore them) and flags; progress is where verify and
// import write their progress lines. It returns the report to render. Errors: ErrInput for an
// unknown NAME, and those of List, RemoveArgs, Verify, PinArgs and ImportArgs.
func (c *Client) Command(ctx context.Context, name string, args []string, flags CommandFlags, progress io.Writer) (clitext.Renderer, error) {
	switch name {
	case "ls":
		return c.List(ctx)
	case "rm":
		return c.RemoveArgs(ctx, args)
	case "verify":
		return c.Verify(ctx, flags.Rate, 0, progress)
	case "pin", "unpin":
		return c.PinArgs(ctx, args, name == "unpin")
	case "pins":
		return c.PinList(ctx)
	case "import":
		return c.ImportArgs(ctx, args, flags.Ref, progress)
	}
	return nil, fmt.Errorf("%w: unknown cache command %q: want ls, rm, verify, pin, unpin, pins or import", ErrInput, name)
}

// ExitCodes is what the exit codes of `nodecache cache NAME` mean (docs/contracts.md), for its
// --help: 0 done, 1 the answer is negative or serve failed, 2 input refused.
func ExitCodes(name string) string {
	const serve = "serve unreachable at --listen-url, not nodecache serve, or refusing"
	one := map[string]string{
		"ls":     "0 listed; 1 " + serve,
		"rm":     "0 evicted; 1 not cached, pinned (unpin it first), a platform manifest of a cached index (remove the index), or " + serve,
		"verify": "0 every stored blob matched its digest; 1 a blob corrupt (evicted) or unreadable, the pass not finished, or " + serve,
		"pin":    "0 pinned (or already pinned); 1 not cached (nothing is fetched for a pin), the pins over 80% of --max-size, or " + serve,
		"unpin":  "0 unpinned; 1 not pinned, or " + serve,
		"pins":   "0 listed; 1 " + serve,
		"import": "0 every image stored and pinned; 1 a blob of the bundle missing or damaged (nothing stored), the pins over 80% of --max-size, or " + serve,
	}[name]
	two := map[string]string{
		"rm": "a flag or the image refused", "pin": "a flag or the image refused", "unpin": "a flag or the image refused",
		"verify": "a flag refused (--rate by serve too)",
		"import": "a flag refused, DIR not a bundle, --ref missing or not needed, an image of a registry serve has no --upstream for",
	}[name]
	if two == "" {
		two = "a flag refused"
	}
	return "Exit codes: " + one + "; 2 " + two + "."
}

// ParsePinSpec checks "<upstream>/<repository>:<tag>" or "<upstream>/<repository>@<digest>"
// (what `cache pin` and `cache unpin` take) and returns it. Errors wrap ErrInput.
func ParsePinSpec(spec string) (string, error) {
	return parseImageSpec(spec, "want UPSTREAM/REPOSITORY:TAG or UPSTREAM/REPOSITORY@DIGEST, e.g. docker.io/library/alpine:3.20 or docker.io/library/alpine@sha256:<64 hex digits>")
}

// PinArgs is Pin (or, with unpin, Unpin) of the one spec in args (ErrInput unless there is
// exactly one; a flag after it is named, with where it goes).
func (c *Client) PinArgs(ctx context.Context, args []string, unpin bool) (*PinReport, error) {
	cmd := "pin"
	if unpin {
		cmd = "unpin"
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("%w: argument %q looks like a flag: flags go before UPSTREAM/REPOSITORY:TAG, e.g. nodecache cache %s --output json docker.io/library/alpine:3.20", ErrInput, a, cmd)
		}
	}
	if len(args) != 1 {
		return nil, fmt.Errorf("%w: cache %s takes one UPSTREAM/REPOSITORY:TAG or UPSTREAM/REPOSITORY@DIGEST, got %s", ErrInput, cmd, clitext.Count(len(args), "argument"))
	}
	if unpin {
		return c.Unpin(ctx, args[0])
	}
	return c.Pin(ctx, args[0])
}

// Pin pins what serve's cache holds of the image spec names ("<upstream>/<repository>:<tag>",
// followed as the tag moves, or "…@<digest>"); serve accepts it from loopback and its --allow
// networks. Errors: ErrInput for a bad spec (serve's 400 too: an upstream it does not have),
// ErrNotCached when serve does not hold it (nothing is fetched), serve's refusal (over 80% of
// the cap: its message names the cap; 403 outside --allow) or failure; nothing listening is said
// as List says it.
func (c *Client) Pin(ctx context.Context, spec string) (*PinReport, error) {
	if _, err := ParsePinSpec(spec); err != nil {
		return nil, err
	}
	var p mirrorapi.Pin
	if err := c.do(ctx, http.MethodPut, mirrorapi.CachePinsPath+"/"+spec, &p); err != nil {
		return nil, err
	}
	return &PinReport{Pin: p}, nil
}

// Unpin drops serve's pin of spec (as Pin takes it, the tag or digest it was pinned by).
// Errors: as Pin's, and ErrNotPinned (serve's message names the pins that hold the image when a
// digest was given) instead of ErrNotCached.
func (c *Client) Unpin(ctx context.Context, spec string) (*PinReport, error) {
	if _, err := ParsePinSpec(spec); err != nil {
		return nil, err
	}
	var p mirrorapi.Pin
	if err := c.do(ctx, http.MethodDelete, mirrorapi.CachePinsPath+"/"+spec, &p); err != nil {
		return nil, err
	}
	return &PinReport{Pin: p, Unpinned: true}, nil
}

// Pins returns serve's pins (GET mirrorapi.CachePinsPath).
func (c *Client) Pins(ctx context.Context) (*mirrorapi.PinList, error) {
	var l mirrorapi.PinList
	if err := c.do(ctx, http.MethodGet, mirrorapi.CachePinsPath, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// PinReport is `cache pin`'s and `cache unpin`'s report: the pin made or dropped.
type PinReport struct {
	Pin      mirrorapi.Pin
	Unpinned bool
}

// WriteJSON writes the pin as serve answered it.
func (r *PinReport) WriteJSON(w io.Writer) error { return json.NewEncoder(w).Encode(r.Pin) }

// WriteText writes one line naming the pin, its digest (and the one its tag moved to) and the
// bytes it holds.
func (r *PinReport) WriteText(w io.Writer) error {
	p := r.Pin
	name := p.Upstream + "/" + p.Repository + "@" + p.Digest
	if p.Tag != "" {
		name = p.Upstream + "/" + p.Repository + ":" + p.Tag + " (" + p.Digest
		if p.Next != "" {
			name += ", moving to " + p.Next
		}
		name += ")"
	}
	verb := "pinned"
	if r.Unpinned {
		verb = "unpinned"
	}
	_, err := fmt.Fprintf(w, "%s %s, %s\n", verb, name, clitext.Bytes(p.SizeBytes))
	return err
}

// ErrVerifyLost is Verify's error when the pass it follows is gone from serve before its end:
// serve stopped (the pass is reported stopped) or restarted, or another pass replaced it.
var ErrVerifyLost = errors.New("the verify pass did not finish")

// Verify starts a verify pass on serve (POST mirrorapi.CacheVerifyPath; serve accepts it from
// loopback and its --allow networks) reading at most rate, bytes a second as cache verify's
// --rate takes it, which serve reads ("": serve's --scrub-rate), or joins the one running, then
// follows it (GET, soon and then every poll; 0: one second) until it is over, writing a
// ProgressLine to progress (when not nil) each time it changed. It returns the pass as it ended (Verdict tells whether it was clean). Errors: serve's
// refusal or failure (nothing listening is said as List says it; a rate serve refuses wraps
// ErrInput), ErrVerifyLost, ctx's.
func (c *Client) Verify(ctx context.Context, rate string, poll time.Duration, progress io.Writer) (*Verification, error) {
	if poll <= 0 {
		poll = time.Second
	}
	path := mirrorapi.CacheVerifyPath
	if rate != "" {
		path += "?rate=" + url.QueryEscape(rate)
	}
	var p mirrorapi.VerifyPass
	if err := c.do(ctx, http.MethodPost, path, &p); err != nil {
		return nil, err
	}
	id, wait, last := p.ID, min(100*time.Millisecond, poll), ""
	for p.State == mirrorapi.VerifyRunning {
		if line := ProgressLine(p); progress != nil && line != last {
			_, _ = fmt.Fprintln(progress, line)
			last = line
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, poll) // a small cache is done at once; a large one is asked every poll
		if err := c.do(ctx, http.MethodGet, mirrorapi.CacheVerifyPath, &p); err != nil {
			return nil, err
		}
		if p.ID != id {
			return nil, fmt.Errorf("%w: serve answers pass %d, not pass %d it started (serve restarted, or the pass was replaced); run it again", ErrVerifyLost, p.ID, id)
		}
	}
	if p.State != mirrorapi.VerifyDone {
		return nil, fmt.Errorf("%w: pass %d is %s after %d of %s (serve is stopping?); %d corrupt so far", ErrVerifyLost, p.ID, p.State, p.Checked, clitext.Count(p.Blobs, "blob"), p.Corrupt)
	}
	return &Verification{VerifyPass: p}, nil
}

// Verification is `cache verify`'s report: the pass as it ended.
type Verification struct{ mirrorapi.VerifyPass }

// Clean reports whether every blob read matched (none corrupt, none unreadable).
func (v *Verification) Clean() bool { return v.Corrupt == 0 && v.Unreadable == 0 }

// Verdict is the error a report stands for once it is rendered: for a Verification that is not
// clean, how many blobs were corrupt or unreadable; nil for any other report.
func Verdict(r clitext.Renderer) error {
	if v, ok := r.(*Verification); ok && !v.Clean() {
		return fmt.Errorf("%d of %s corrupt, %d unreadable", v.Corrupt, clitext.Count(v.Checked, "blob"), v.Unreadable)
	}
	return nil
}

// WriteJSON writes the pass as serve answered it.
func (v *Verification) WriteJSON(w io.Writer) error {
	return writeIndented(w, v.VerifyPass)
}

// WriteText writes one line of totals, then one line per corrupt blob.
func (v *Verification) WriteText(w io.Writer) error {
	took := v.Finished.Sub(v.Started)
	verdict := "clean"
	if !v.Clean() {
		verdict = fmt.Sprintf("%d corrupt (%d evicted: the next pull fetches them again; %d unrepairable)", v.Corrupt, v.Evicted, v.Unrepairable)
		if v.Unreadable > 0 {
			verdict += fmt.Sprintf(", %d unreadable (see serve's log)", v.Unreadable)
		}
	}
	if v.Missing > 0 {
		verdict += fmt.Sprintf("; %d gone meanwhile", v.Missing)
	}
	if _, err := fmt.Fprintf(w, "verified %s (%s) in %s: %s\n", clitext.Count(v.Checked, "blob"), clitext.Bytes(v.CheckedBytes), clitext.Span(took), verdict); err != nil {
		return err
	}
	for _, d := range v.CorruptBlobs {
		if _, err := fmt.Fprintf(w, "corrupt %s\n", d); err != nil {
			return err
		}
	}
	return nil
}

// ProgressLine is one line of a pass's progress, for humans: blobs and bytes read, corrupt so far.
func ProgressLine(p mirrorapi.VerifyPass) string {
	if p.Blobs == 0 && p.Checked == 0 {
		return fmt.Sprintf("verify: pass %d started, at most %s a second", p.ID, clitext.Bytes(p.RateBytes))
	}
	return fmt.Sprintf("verify: %d/%s, %s of %s, %d corrupt", p.Checked, clitext.Count(p.Blobs, "blob"), clitext.Bytes(p.CheckedBytes), clitext.Bytes(p.SizeBytes), p.Corrupt)
}

// Listing is `cache ls`'s report.
type Listing struct{ mirrorapi.CacheInventory }

// WriteJSON writes the inventory document as serve sent it.
func (l *Listing) WriteJSON(w io.Writer) error {
	return writeIndented(w, l.CacheInventory)
}

// WriteText writes one line per image (IMAGE, TAGS, SIZE, LAST PULLED, PINNED; a tag of a child
// manifest is marked "(child)"), then the totals.
func (l *Listing) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tTAGS\tSIZE\tLAST PULLED\tPINNED")
	pinned := 0
	for _, i := range l.Images {
		names := slices.Clone(i.Tags)
		for _, t := range slices.Sorted(maps.Keys(i.ChildTags)) {
			names = append(names, t+"(child)") // a tag has no "(": the mark cannot be misread
		}
		tags := strings.Join(names, ",")
		if tags == "" {
			tags = "-"
		}
		mark := "-"
		if i.Pinned {
			mark = "pinned"
			pinned++
		}
		fmt.Fprintf(tw, "%s/%s@%s\t%s\t%s\t%s\t%s\n", i.Upstream, i.Repository, i.Digest, tags, clitext.Bytes(i.SizeBytes), i.LastPulled.Format(time.RFC3339), mark)
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
	if _, err := fmt.Fprintf(w, "%s, %s, %s (%s); %d pinned, %s pinned%s\n", clitext.Count(len(l.Images), "image"), clitext.Count(l.Blobs, "blob"), clitext.Bytes(l.SizeBytes), limit,
		pinned, clitext.Bytes(l.PinnedBytes), note); err != nil {
		return err
	}
	if l.UnreferencedBlobs > 0 {
		// Counted in the totals above but under no image: say so, or the totals look wrong.
		if _, err := fmt.Fprintf(w, "unreferenced blobs: %d, %s (no cached manifest names them; evicted first)\n", l.UnreferencedBlobs, clitext.Bytes(l.UnreferencedBytes)); err != nil {
			return err
		}
	}
	return nil
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
