// Package warm pre-fills a pull-through registry cache with images, for one platform only.
//
// It talks only to the mirror (nodecache, or any OCI pull-through registry such as a stock
// registry:2 proxy), never to an upstream: it resolves each reference through the mirror, takes
// from an index exactly the manifest for the platform (containerd's matching rules, no fallback
// to another architecture; attestation manifests never fetched) — or, for a single manifest,
// checks the platform its config names before any layer — and fetches the config and every
// layer through the mirror, discarding the layers' bodies while hashing them. The mirror caches
// what passes through it; warm proves each byte arrived intact.
package warm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Defaults for Options (and the CLI flags of the same names).
const (
	DefaultWait          = 10 * time.Minute // --wait
	DefaultDeadline      = 60 * time.Minute // --deadline
	DefaultConcurrency   = 4                // --concurrency
	DefaultBlobTimeout   = 10 * time.Minute // --blob-timeout
	DefaultRetries       = 5                // --retries
	DefaultProbeTimeout  = 3 * time.Second
	DefaultProbeInterval = 1 * time.Second
	DefaultBackoff       = 500 * time.Millisecond
	DefaultMaxBackoff    = 30 * time.Second
)

// Options configures Run. The zero value of every optional field means its default.
type Options struct {
	// Mirror is the mirror's base URL (name.ParseMirror). Required unless Bundle is set.
	Mirror *url.URL
	// Bundle, when set, makes Run write the images into a bundle directory straight from their
	// upstreams (warm --to) instead of fetching them through Mirror; Mirror, Routing and Wait
	// are then unused.
	Bundle *BundleOptions
	// Images are the references to warm (see ParseReference). Required, at least one.
	Images []Reference
	// Sources says where each of Images was named (same order) and Notes what the sources could
	// not follow exactly; Config.Options fills them, Run does not read them.
	Sources []Source
	Notes   []string
	// Platform is the platform to walk. Zero value: this machine's (platforms.DefaultSpec).
	Platform specs.Platform
	// PlatformMatch is the rule that picks an index's manifest for Platform (and checks a single
	// manifest's config). Default PlatformMatchTransfer.
	PlatformMatch PlatformMatch
	// Routing names the upstream to the mirror. Default RoutingNS.
	Routing Routing
	// Talos, when set, is reported as the source of Images.
	Talos *TalosJoinSet
	// Wait is how long to wait, by wall clock, for the mirror to answer GET /v2/. Default
	// DefaultWait; negative means a single probe.
	Wait time.Duration
	// ProbeTimeout bounds one GET /v2/ probe. Default DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// ProbeInterval is the pause between probes. Default DefaultProbeInterval.
	ProbeInterval time.Duration
	// Deadline bounds the whole run, mirror wait included. Default DefaultDeadline; negative
	// means none (the context still applies).
	Deadline time.Duration
	// Concurrency is the number of blobs fetched at once (and of images resolved at once).
	// Default DefaultConcurrency.
	Concurrency int
	// BlobTimeout bounds one attempt at one blob or manifest. Default DefaultBlobTimeout.
	BlobTimeout time.Duration
	// Retries is how many times a failed request is retried on 5xx, 429 (honouring
	// Retry-After), 408, network errors and broken streams. Default DefaultRetries; negative
	// means none.
	Retries int
	// Backoff is the first retry delay; it doubles per retry (with jitter) up to MaxBackoff,
	// which also caps Retry-After. Defaults DefaultBackoff and DefaultMaxBackoff.
	Backoff, MaxBackoff time.Duration
	// Transport carries every request. Default: a clone of http.DefaultTransport, without
	// proxy-from-environment when it talks to a mirror (directly), with it when it talks to
	// upstreams (Bundle: HTTPS_PROXY applies as it does to serve's upstream traffic).
	Transport http.RoundTripper
	// UserAgent is sent with every request. Default buildinfo.UserAgent("warm"),
	// "nodecache-warm/<version>", so the mirror's log tells warm-up from real pulls.
	UserAgent string
	// Progress receives progress output; nil means none. With ProgressBar a redrawn bar
	// (bytes, rate, ETA), for a terminal; otherwise one line per blob.
	Progress    io.Writer
	ProgressBar bool
	// Logger receives retries and debug detail. Default: disabled.
	Logger zerolog.Logger
	// Pin pins each image once it is warm, through the mirror's pin API (PUT
	// mirrorapi.CachePinsPath; issue 24): by tag when the reference names no digest (the pin then
	// follows the tag), else by digest. The pin holds the index and the platform's manifest warm
	// walked and every blob they reference (with anything else the cache holds of that image).
	// The mirror must be a nodecache serve (ErrNotNodecache otherwise, before anything is
	// fetched) that accepts pins from this host: loopback, or its --allow networks.
	Pin bool
}

func (o *Options) setDefaults() error {
	var errs []error
	switch {
	case o.Bundle != nil:
		errs = append(errs, o.Bundle.setDefaults(o.Images))
	case o.Mirror == nil:
		errs = append(errs, refusal.Value("--mirror", "", "required; want http(s)://host[:port]"))
	}
	if len(o.Images) == 0 {
		errs = append(errs, fmt.Errorf("%w: nothing to warm: Options.Images is empty; name at least one image", ErrRefused))
	}
	if o.Concurrency < 0 {
		errs = append(errs, refusal.Value("--concurrency", fmt.Sprint(o.Concurrency), "want at least 1"))
	}
	if o.BlobTimeout < 0 {
		errs = append(errs, refusal.Value("--blob-timeout", o.BlobTimeout.String(), "want a positive duration"))
	}
	routing, err := ParseRouting(string(o.Routing))
	if err != nil {
		errs = append(errs, err)
	}
	o.Routing = routing
	match, err := ParsePlatformMatch(string(o.PlatformMatch))
	if err != nil {
		errs = append(errs, err)
	}
	o.PlatformMatch = match
	if o.Platform.OS == "" && o.Platform.Architecture == "" {
		o.Platform, _ = ParsePlatform("")
	}
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	setDur(&o.Wait, DefaultWait)
	setDur(&o.ProbeTimeout, DefaultProbeTimeout)
	setDur(&o.ProbeInterval, DefaultProbeInterval)
	setDur(&o.Deadline, DefaultDeadline)
	setDur(&o.BlobTimeout, DefaultBlobTimeout)
	setDur(&o.Backoff, DefaultBackoff)
	setDur(&o.MaxBackoff, DefaultMaxBackoff)
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	switch {
	case o.Retries == 0:
		o.Retries = DefaultRetries
	case o.Retries < 0:
		o.Retries = 0
	}
	if o.UserAgent == "" {
		o.UserAgent = buildinfo.UserAgent("warm")
	}
	if o.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if o.Bundle == nil {
			t.Proxy = nil
		}
		t.MaxIdleConnsPerHost = o.Concurrency * 2
		t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		o.Transport = t
	}
	return errors.Join(errs...)
}

// errDeadline is the cause of a run stopped by Options.Deadline.
type errDeadline struct{ d time.Duration }

func (e errDeadline) Error() string { return fmt.Sprintf("--deadline %s reached", e.d) }

// Run waits for the mirror, then warms every image (and pins it, with Options.Pin) and reports
// per image. The returned error is only for a run that could not start: options refused
// (errors.Is(err, ErrRefused)), the mirror never ready (ErrMirrorNotReady) or, with Options.Pin,
// not a nodecache serve (ErrNotNodecache); the report is non-nil either way once options are
// valid.
// Images that fail, and a run stopped by the deadline or ctx, are reported with Warm false and
// a nil error; Report.Warm is the answer.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if opts.Bundle != nil {
		return runBundle(ctx, opts)
	}
	start := time.Now()
	if opts.Deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, opts.Deadline, errDeadline{opts.Deadline})
		defer cancel()
	}
	c := &client{
		base: opts.Mirror, routing: opts.Routing,
		hc:        &http.Client{Transport: opts.Transport},
		userAgent: opts.UserAgent, retries: opts.Retries,
		backoff: opts.Backoff, maxDelay: opts.MaxBackoff, log: opts.Logger,
	}
	rep := &Report{
		Mirror: opts.Mirror.String(), Routing: opts.Routing, Platform: FormatPlatform(opts.Platform), PlatformMatch: opts.PlatformMatch,
		Talos: opts.Talos, Images: make([]ImageReport, len(opts.Images)),
	}
	for i, ref := range opts.Images {
		rep.Images[i] = ImageReport{Input: ref.Input, Reference: ref.String()}
	}
	finish := func() *Report {
		rep.Seconds = time.Since(start).Seconds()
		return rep
	}

	waited, err := c.waitForMirror(ctx, opts.Wait, opts.ProbeTimeout, opts.ProbeInterval)
	secs := waited.Seconds()
	rep.MirrorWaitSeconds = &secs
	if err != nil {
		rep.Error = err.Error()
		for i := range rep.Images {
			rep.Images[i].Error = "not attempted: mirror not ready"
		}
		return finish(), err
	}
	opts.Logger.Debug().Str("waited", clitext.Span(waited)).Str("mirror", rep.Mirror).Msg("mirror ready")
	rep.Pin = opts.Pin
	if opts.Pin && c.mirrorVersion == "" {
		err := fmt.Errorf("%w: %s answered GET /v2/ without the %s header, so it is not nodecache serve and keeps no pins: drop --pin, or point --mirror at nodecache serve",
			ErrNotNodecache, opts.Mirror, mirrorapi.HeaderVersion)
		rep.Error = err.Error()
		for i := range rep.Images {
			rep.Images[i].Error = "not attempted: --pin needs nodecache serve"
		}
		return finish(), err
	}

	prog, stopBar := startProgress(ctx, &opts)
	w := &walker{c: c, opts: &opts, prog: prog, matcher: newPlatformMatcher(opts.Platform, opts.PlatformMatch),
		sem: make(chan struct{}, opts.Concurrency), blobs: map[string]blobOutcome{}}
	var g errgroup.Group
	g.SetLimit(opts.Concurrency)
	for i, ref := range opts.Images {
		g.Go(func() error {
			w.image(ctx, ref, &rep.Images[i])
			return nil
		})
	}
	_ = g.Wait()
	stopBar()

	rep.Warm = true
	for i := range rep.Images {
		rep.Warm = rep.Warm && rep.Images[i].Warm
		if rep.Images[i].Pinned {
			rep.PinnedImages++
		}
	}
	rep.countBlobs(w.blobs)
	if ctx.Err() != nil {
		rep.Error = fmt.Sprintf("stopped: %v", context.Cause(ctx))
	}
	return finish(), nil
}

// startProgress starts the run's progress output (Options.Progress: a bar redrawn until stop is
// called, or a line per blob; none when nil).
func startProgress(ctx context.Context, opts *Options) (prog progress, stop func()) {
	switch {
	case opts.Progress != nil && opts.ProgressBar:
		bar := newBarProgress(opts.Progress)
		bctx, bcancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); bar.run(bctx, 200*time.Millisecond) }()
		return bar, func() { bcancel(); <-done }
	case opts.Progress != nil:
		return &lineProgress{w: opts.Progress}, func() {}
	}
	return noProgress{}, func() {}
}

// countBlobs counts the run's blob outcomes (each blob once, whatever the images sharing it).
func (r *Report) countBlobs(blobs map[string]blobOutcome) {
	for _, o := range blobs {
		switch {
		case o.external:
			r.BlobsExternal++
		case o.err != nil:
			r.BlobsFailed++
		case o.present:
			r.BlobsPresent++
		default:
			r.BlobsFetched++
			r.Bytes += o.res.Bytes
		}
	}
}

// walker holds the state shared by the images of one run.
type walker struct {
	c       *client // the mirror's; nil with warm --to (ups)
	opts    *Options
	prog    progress
	matcher platformMatcher
	sem     chan struct{} // bounds concurrent blob fetches

	// With warm --to: the bundle written, a client per upstream (by name.Canonical of its
	// name), and --platform all.
	out    *bundle.Writer
	ups    map[string]*client
	all    bool
	stored map[string]v1.Descriptor // by Reference.String: what each image stored names

	group singleflight.Group // one fetch per blobKey
	mu    sync.Mutex
	blobs map[string]blobOutcome
}

type blobOutcome struct {
	res      blobResult
	err      error
	external bool
	present  bool // warm --to: in the bundle already, verified, not fetched
}

// client is the client that fetches ref: the mirror's, or with warm --to its upstream's.
func (w *walker) client(ref Reference) *client {
	if w.ups != nil {
		return w.ups[name.Canonical(ref.Registry)]
	}
	return w.c
}

// blobKey names blob d of ref once per run: per repository through a mirror (each repository's
// blob is cached on its own), per digest in a bundle (stored once).
func (w *walker) blobKey(ref Reference, d v1.Descriptor) string {
	if w.out != nil {
		return d.Digest.String()
	}
	return ref.Registry + "/" + ref.Repository + "@" + d.Digest.String()
}

// image warms one image and fills its report entry.
func (w *walker) image(ctx context.Context, ref Reference, out *ImageReport) {
	start := time.Now()
	defer func() { out.Seconds = time.Since(start).Seconds() }()
	walked, err := w.walk(ctx, ref)
	out.Manifests, out.Skipped = walked.Manifests, walked.Skipped
	for _, v := range walked.Caches {
		out.countCache(v)
	}
	if walked.Top.Digest != "" {
		out.Digest = walked.Top.Digest.String()
	}
	if err != nil {
		out.Error = describe(ctx, err)
		return
	}
	out.Manifest, out.Platform = walked.ManifestDigest.String(), walked.Platform
	if w.all && walked.Top.MediaType.IsIndex() {
		out.Platform = "all"
	}
	if w.out != nil {
		if err := w.storeManifests(ref, walked.Docs); err != nil {
			out.Error = err.Error()
			return
		}
	}

	// A single manifest (no index) carries no platform of its own; its config names it. Check
	// that before any layer is fetched, so a wrong-architecture image fetches only its config.
	if !w.all && walked.Platform == "" && len(walked.Manifest.Config.URLs) == 0 {
		o, problem := w.checkConfig(ctx, ref, walked.Manifest.Config, out)
		if problem != "" {
			out.countCache(o.res.Cache)
			if o.err != nil {
				out.BlobsFailed++
			} else {
				out.BlobsFetched++
				out.Bytes += o.res.Bytes
			}
			out.Error = problem
			return
		}
	}

	w.fetchImage(ctx, ref, walked, out)
}

// walk resolves ref to the manifests to fetch: the platform's, or with warm --to --platform all
// every one of an index.
func (w *walker) walk(ctx context.Context, ref Reference) (walked, error) {
	if w.all {
		return w.client(ref).walkAll(ctx, ref, w.opts.BlobTimeout)
	}
	return w.client(ref).walk(ctx, ref, w.matcher, w.opts.BlobTimeout)
}

// fetchImage fetches the blobs of the image manifests walked and says whether the image is warm
// (with warm --to: added to the bundle).
func (w *walker) fetchImage(ctx context.Context, ref Reference, walked walked, out *ImageReport) {
	todo := w.blobsToFetch(ref, walked.Images, out)
	var errs []error
	for _, o := range w.fetchBlobs(ctx, ref, todo) {
		out.countCache(o.res.Cache)
		switch {
		case o.err != nil:
			out.BlobsFailed++
			errs = append(errs, o.err)
		case o.present:
			out.BlobsPresent++
		default:
			out.BlobsFetched++
			out.Bytes += o.res.Bytes
		}
	}
	switch {
	case len(errs) > 0:
		out.Error = fmt.Sprintf("%d of %s failed; first: %s", len(errs), clitext.Count(len(todo), "blob"), describe(ctx, errs[0]))
	case out.BlobsFetched == 0 && out.BlobsPresent == 0:
		out.Error = "nothing fetched: every layer is external (foreign), so the cache holds none of it"
	case w.out != nil:
		w.mu.Lock()
		w.stored[ref.String()] = walked.Top.descriptor() // listed by runBundle, in the run's order
		w.mu.Unlock()
		out.Warm = true
	default:
		out.Warm = true
		if w.opts.Pin {
			w.pinImage(ctx, ref, out)
		}
	}
}

// countCache counts one answer of the mirror's cache header (none: "").
func (out *ImageReport) countCache(v string) {
	if v == "" {
		return
	}
	if out.Cache == nil {
		out.Cache = map[string]int{}
	}
	out.Cache[v]++
}

// blobsToFetch is the config and every layer of the manifests ms, once each; foreign layers
// (with urls) are reported only, not returned.
func (w *walker) blobsToFetch(ref Reference, ms []*v1.Manifest, out *ImageReport) []v1.Descriptor {
	var (
		todo []v1.Descriptor
		all  []v1.Descriptor
	)
	for _, m := range ms {
		all = append(append(all, m.Config), m.Layers...)
	}
	seen := map[v1.Hash]bool{}
	for _, d := range all {
		if seen[d.Digest] {
			continue
		}
		seen[d.Digest] = true
		if len(d.URLs) > 0 {
			out.BlobsExternal++
			out.External = append(out.External, ExternalBlob{Digest: d.Digest.String(), Size: d.Size, URLs: d.URLs})
			w.record(ref, d, blobOutcome{external: true})
			w.prog.blob(blobEvent{Image: ref.String(), Digest: d.Digest.String(), Size: d.Size, External: d.URLs})
			continue
		}
		todo = append(todo, d)
	}
	return todo
}

// fetchBlobs fetches the blobs todo of ref at once (bounded by the run's concurrency) and returns
// their outcomes in todo's order.
func (w *walker) fetchBlobs(ctx context.Context, ref Reference, todo []v1.Descriptor) []blobOutcome {
	results := make([]blobOutcome, len(todo))
	var wg sync.WaitGroup
	for i, d := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = w.fetchBlob(ctx, ref, d)
		}()
	}
	wg.Wait()
	return results
}

// fetchBlob fetches blob d of ref once per run, whichever image asks first (the outcome is
// recorded and shared).
func (w *walker) fetchBlob(ctx context.Context, ref Reference, d v1.Descriptor) blobOutcome {
	key := w.blobKey(ref, d)
	v, _, _ := w.group.Do(key, func() (any, error) {
		w.mu.Lock()
		if o, ok := w.blobs[key]; ok {
			w.mu.Unlock()
			return o, nil
		}
		w.mu.Unlock()
		w.prog.planned(d.Size)
		select {
		case w.sem <- struct{}{}:
		case <-ctx.Done():
			o := blobOutcome{err: fmt.Errorf("blob %s not started: %w", d.Digest, context.Cause(ctx))}
			w.record(ref, d, o)
			w.prog.blob(blobEvent{Image: ref.String(), Digest: d.Digest.String(), Size: d.Size, Err: o.err})
			return o, nil
		}
		var o blobOutcome
		if w.out != nil {
			o = w.storeBlob(ctx, ref, d)
		} else {
			o.res, o.err = w.c.getBlob(ctx, ref, d, w.opts.BlobTimeout, w.prog, nil)
		}
		<-w.sem
		w.record(ref, d, o)
		w.prog.blob(blobEvent{Image: ref.String(), Digest: d.Digest.String(), Size: d.Size,
			Took: o.res.Duration, Cache: o.res.Cache, Attempts: o.res.Attempts, Present: o.present, Err: o.err})
		return o, nil
	})
	return v.(blobOutcome)
}

// maxConfigBytes is the largest image config whose platform warm reads (bytes); a larger one is
// fetched without the check, with a note. Real configs are a few KiB.
const maxConfigBytes = 16 << 20

// checkConfig fetches the config d of ref's single manifest and compares the platform it names
// with Options.Platform by the rules of the index walk (containerd's matcher, same architecture
// only) — what containerd reads before it accepts a single manifest for a platform
// (images.ConfigPlatform). The outcome is recorded, so the layer pass counts the config without
// fetching it again. problem is non-empty when the image must fail without fetching a layer: the
// config could not be fetched or parsed, or names another platform. A config that names no
// platform passes with out.Note set.
func (w *walker) checkConfig(ctx context.Context, ref Reference, d v1.Descriptor, out *ImageReport) (o blobOutcome, problem string) {
	if d.Size > maxConfigBytes {
		out.Note = fmt.Sprintf("config %s is %s, larger than %s: platform not checked", d.Digest, clitext.Bytes(d.Size), clitext.Bytes(maxConfigBytes))
		return o, ""
	}
	w.prog.planned(d.Size)
	select {
	case w.sem <- struct{}{}:
	case <-ctx.Done():
		o.err = fmt.Errorf("config %s not started: %w", d.Digest, context.Cause(ctx))
		w.record(ref, d, o)
		w.prog.blob(blobEvent{Image: ref.String(), Digest: d.Digest.String(), Size: d.Size, Err: o.err})
		return o, fmt.Sprintf("%s; no layer fetched", describe(ctx, o.err))
	}
	var body bytes.Buffer
	o = w.getConfig(ctx, ref, d, &body)
	<-w.sem
	w.record(ref, d, o)
	w.prog.blob(blobEvent{Image: ref.String(), Digest: d.Digest.String(), Size: d.Size,
		Took: o.res.Duration, Cache: o.res.Cache, Attempts: o.res.Attempts, Present: o.present, Err: o.err})
	if o.err != nil {
		return o, fmt.Sprintf("config %s: %s; its platform is unknown, so no layer was fetched", d.Digest, describe(ctx, o.err))
	}
	got, named, err := configPlatform(body.Bytes())
	switch {
	case err != nil:
		return o, fmt.Sprintf("config %s: %v; its platform is unknown, so no layer was fetched", d.Digest, err)
	case !named:
		out.Note = fmt.Sprintf("single manifest whose config %s names no platform (no os or architecture): warmed for %s without a platform check", d.Digest, FormatPlatform(w.matcher.want))
		return o, ""
	case !w.matcher.matchSpec(got):
		return o, fmt.Sprintf("image is %s, not %s %s (a single manifest; its config names the platform); no layer fetched",
			FormatPlatform(got), FormatPlatform(w.matcher.want), w.matcher.rule.describe())
	}
	return o, ""
}

func (w *walker) record(ref Reference, d v1.Descriptor, o blobOutcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.blobs[w.blobKey(ref, d)] = o
}

// describe renders err for a report, naming the deadline when it stopped the work.
func describe(ctx context.Context, err error) string {
	var dl errDeadline
	if cause := context.Cause(ctx); cause != nil && errors.As(cause, &dl) && !errors.As(err, &dl) {
		return fmt.Sprintf("%v (%v)", err, cause)
	}
	return err.Error()
}
