// Package mirror is nodecache's pull-through OCI registry: many upstream registries behind one
// port, chosen per request by containerd's ?ns= parameter or a /v2/<registry>/ path prefix,
// read-only, filled from the configured upstreams only.
//
// nodecache answers the OCI read API itself (read.go, manifests.go, blobs.go, tags.go: route →
// cache → upstream on a miss → response); distribution provides the storage under it (storage
// driver, blob store, links, manifest formats). The upstream side (package upstream) fetches
// with one upstream fetch per blob however many clients ask, resumed when the stream breaks,
// verified before the last byte is released and before it is stored; package cache owns the
// on-disk cache.
package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// Mirror is the pull-through registry. It is an http.Handler serving the registry API under
// /v2/, /healthz, /readyz, /metrics, /nodecache/v1/clients and the other /nodecache/v1/ endpoints.
type Mirror struct {
	opts            Options
	log             zerolog.Logger
	upstreams       map[string]*configured // by name
	byKey           map[string]*configured // by storage key
	defaultUpstream *configured
	store           distribution.Namespace // distribution's storage over the cache's driver
	fetch           *upstream.Fetcher
	metrics         *metrics
	gatherer        prometheus.Gatherer
	clients         *clientLog
	pull            pullGate
	canary          *canary
	cache           *cache.Store // storage driver, index, eviction, root lock
	peering         *peering     // nil without Options.Peers
	// listening, when set (by Serve), is closed once the listeners are bound: the membership's
	// first round then finds this node's own peer port answering.
	listening chan struct{}
	// read answers a routed repository read: (*Mirror).read; a test replaces it to make the
	// handler panic.
	read func(ctx context.Context, w http.ResponseWriter, r *http.Request, rt route) (outcome, error)
	// fillJoined, when set (by a test, to end the fill meanwhile), is called by a blob GET that
	// joined a fill in flight, before it reads the fill.
	fillJoined func()
	// openBundle opens a bundle for Options.Seed: bundle.Open; a test replaces it to hold the
	// seed back.
	openBundle func(ctx context.Context, dir string, opts bundle.ReadOptions) (*bundle.Reader, error)
	// seedStatus is the seed's part of readiness (seed.go), under seedMu.
	seedMu     sync.Mutex
	seedStatus seedState
}

// configured is a configured upstream with its storage key and its upstream side (nil for an
// offline upstream: every read checks Offline before it would ask).
type configured struct {
	name.Upstream
	storageKey string
	remote     *upstream.Remote
}

// New builds a Mirror from opts. It creates the storage root and its staging directory if
// needed, but starts nothing: no goroutine, no lock, no file removed, no upstream contacted
// (serving what it has works while every upstream is down). Run takes the root and starts the
// background work; ServeHTTP answers with or without it (tests).
//
// Errors: an invalid Options (every problem, joined), an unusable root.
func New(ctx context.Context, opts Options) (*Mirror, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if opts.UserAgent == "" {
		opts.UserAgent = buildinfo.UserAgent("")
	}
	if opts.InstanceID == "" {
		opts.InstanceID = upstream.NewInstanceID() // the membership knows this node by it too
	}
	gatherer := metricsGatherer(&opts)
	m := &Mirror{
		opts:      opts,
		log:       opts.Logger,
		upstreams: map[string]*configured{},
		byKey:     map[string]*configured{},
		gatherer:  gatherer,
		clients:   newClientLog(opts.ClientEvidenceAllow),
		pull:      pullGate{allow: opts.PullAllow},

		openBundle: bundle.Open, seedStatus: seedStart(opts.Seed),
	}
	m.read = m.readRepository
	var err error
	if m.cache, err = m.newStore(ctx); err != nil {
		return nil, err
	}
	if m.metrics, err = newMetrics(opts.Registerer, m.cache, opts.MaxSize); err != nil {
		_ = m.cache.Close() // a temporary staging directory goes
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	if err := offlineGauge(opts.Registerer, opts.Upstreams); err != nil {
		_ = m.cache.Close()
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	var peers *upstream.Peers
	m.peering, peers = newPeering(opts.Peers, opts.InstanceID, opts)
	if err := m.peering.register(opts.Registerer); err != nil {
		_ = m.cache.Close()
		return nil, fmt.Errorf("register peer metrics: %w", err)
	}
	if m.peering != nil {
		m.metrics.refused.WithLabelValues(RefusedPeerKey) // at 0: "none yet", not "no data"
	}
	fetch, err := newFetcher(ctx, opts, m.cache, peers)
	if err != nil {
		_ = m.cache.Close()
		return nil, err
	}
	m.fetch = fetch
	for _, u := range opts.Upstreams {
		key := storageKey(u.Name)
		if m.byKey[key] != nil {
			key = storageKey("\x00" + u.Name) // two names sanitised alike: hash the later one
		}
		up := &configured{Upstream: u, storageKey: key, remote: fetch.Remote(u.Name)}
		m.upstreams[u.Name] = up
		m.byKey[key] = up
	}
	m.defaultUpstream = m.upstreams[opts.DefaultUpstream]
	if m.canary, err = newCanary(); err != nil {
		_ = m.cache.Close()
		return nil, fmt.Errorf("build canary image: %w", err)
	}
	if m.store, err = newStorage(context.WithoutCancel(ctx), m.cache.Driver()); err != nil {
		_ = m.cache.Close()
		return nil, err
	}
	m.log.Info().Str("root", opts.Root).Str("storage", opts.Storage).Str("s3_bucket", opts.S3.Bucket).Strs("upstreams", names(opts.Upstreams)).
		Str("default_upstream", opts.DefaultUpstream).Str("upstream_timeout", clitext.Span(opts.UpstreamTimeout)).Int("upstream_concurrency", opts.UpstreamConcurrency).
		Str("tag_ttl", clitext.Span(opts.TagTTL)).Str("fill_timeout", clitext.Span(opts.FillTimeout)).Str("chain", chainString(opts.Chain)).Str("instance_id", fetch.InstanceID()).
		Int64("max_size_bytes", opts.MaxSize).Str("peers", m.peering.source()).
		Str("scrub_interval", scrubString(opts.ScrubInterval)).Int64("scrub_rate_bytes_per_second", opts.ScrubRate).Msg("mirror configured")
	if off := offlineNames(opts.Upstreams); len(off) > 0 {
		m.log.Info().Strs("offline_upstreams", off).Msg("offline upstreams: served from the cache only, never asked (nor --chain or --peers for them); a miss is 404 at once")
	}
	return m, nil
}

// newStore builds the cache store over m.opts' storage (storageConfig), its eviction reporting
// to m's metrics and leaving alone what m's fetcher is filling, and its Take the staging files
// of those fills (both set before it runs).
func (m *Mirror) newStore(ctx context.Context) (*cache.Store, error) {
	return cache.New(ctx, cache.Options{
		Root:    m.opts.Root,
		Kind:    m.opts.Storage,
		Config:  storageConfig(m.opts),
		MaxSize: m.opts.MaxSize,
		Clock:   m.opts.Clock,
		Logger:  m.opts.Logger,
		Filling: func(d digest.Digest) bool { return m.fetch.FillingDigest(d) },
		Evicted: func(reason string) { m.metrics.evictions.WithLabelValues(reason).Inc() },
		Freed:   func(n int64) { m.metrics.evictedBytes.Add(float64(n)) },
		Corrupt: func(foundBy string) { m.metrics.corrupt.WithLabelValues(foundBy).Inc() },

		ScrubInterval: max(m.opts.ScrubInterval, 0), // ScrubOff: none
		ScrubRate:     m.opts.ScrubRate,

		UploadMaxAge: m.opts.FillTimeout,
		StagingInUse: func(path string) bool { return m.fetch.StagingInUse(path) },
	})
}

// metricsGatherer is where /metrics gathers from: Options.Gatherer, else the Registerer when it
// gathers too, else the default gatherer. Without a Registerer, opts gets a registry of its own,
// which is the gatherer.
func metricsGatherer(opts *Options) prometheus.Gatherer {
	gatherer := opts.Gatherer
	if opts.Registerer == nil {
		reg := prometheus.NewRegistry()
		opts.Registerer, gatherer = reg, reg
	}
	if gatherer == nil {
		if g, ok := opts.Registerer.(prometheus.Gatherer); ok {
			gatherer = g
		} else {
			gatherer = prometheus.DefaultGatherer
		}
	}
	return gatherer
}

// newFetcher builds the upstream fetcher of opts' upstreams but the offline ones (which get no
// remote: nothing can reach them), staging fills under the storage root, reporting a full disk
// to st, asking peers first when set.
func newFetcher(ctx context.Context, opts Options, st *cache.Store, peers *upstream.Peers) (*upstream.Fetcher, error) {
	regs := make([]upstream.Registry, 0, len(opts.Upstreams))
	for _, u := range opts.Upstreams {
		if u.Offline {
			continue
		}
		regs = append(regs, upstream.Registry{Name: u.Name, URL: u.URL,
			Credentials: opts.UpstreamCredentials[u.Name], RootCAs: opts.UpstreamRootCAs[u.Name]})
	}
	return upstream.New(ctx, regs, upstream.Options{
		StagingDir:  st.StagingDir(),
		Timeout:     opts.UpstreamTimeout,
		Concurrency: opts.UpstreamConcurrency,
		TagTTL:      opts.TagTTL,
		FillTimeout: opts.FillTimeout,
		Transport:   opts.Transport,
		UserAgent:   opts.UserAgent,
		Logger:      opts.Logger,
		Registerer:  opts.Registerer,
		OnDiskFull:  st.DiskFull,
		Clock:       opts.Clock,
		Chain:       opts.Chain,
		InstanceID:  opts.InstanceID,

		AllowPrivate:       opts.UpstreamAllowPrivate,
		Resolver:           opts.UpstreamResolver,
		MaxUnknownBlobSize: opts.MaxUnknownBlobSize,
		Peers:              peers,
	})
}

// scrubString is the scrub interval as the start line reports it: a span, or "off".
func scrubString(d time.Duration) string {
	if d <= 0 {
		return "off"
	}
	return clitext.Span(d)
}

func names(ups []name.Upstream) []string {
	out := make([]string, len(ups))
	for i, u := range ups {
		out[i] = u.Name
	}
	return out
}

// WaitIdle blocks until no blob fill is in flight (every started fill is stored or failed), or
// ctx ends.
func (m *Mirror) WaitIdle(ctx context.Context) error { return m.fetch.WaitIdle(ctx) }

// Drain lets blob fills in flight finish until ctx ends, then abandons the rest (their partial
// data is dropped; nothing half-written is ever stored). It returns how many were abandoned.
func (m *Mirror) Drain(ctx context.Context) int { return m.fetch.Drain(ctx) }

// Close abandons fills still in flight (see Drain for a graceful stop) and stops background
// work.
func (m *Mirror) Close() error {
	err := m.fetch.Close()
	// The index is written before the root lock is released: the next process reads a clean
	// one. A temporary staging directory (in-memory storage) is removed.
	if serr := m.cache.Close(); serr != nil {
		m.log.Warn().Err(serr).Msg("write cache index at shutdown")
	}
	return err
}

// Ready reports whether the mirror can serve: its storage root is writable, and the images of
// Options.Seed are stored.
func (m *Mirror) Ready(_ context.Context) error {
	if err := m.seedReady(); err != nil {
		return err
	}
	f, err := os.CreateTemp(m.fetch.StagingDir(), "ready-*")
	if err != nil {
		return fmt.Errorf("storage not writable: %w", err)
	}
	_ = f.Close()
	return os.Remove(f.Name())
}

// MetricsHandler serves the mirror's metrics in the Prometheus text format.
func (m *Mirror) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(m.gatherer, promhttp.HandlerOpts{})
}

// MaxRequestURI bounds a request's target (path and query): a registry path is a repository name
// (at most 255 characters), a kind and a reference, so 8 KiB leaves room for any real one.
const MaxRequestURI = 8 << 10

// ServeHTTP answers the registry API (GET and HEAD only) and the operational endpoints.
func (m *Mirror) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(r.RequestURI) > MaxRequestURI {
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("request target of %d bytes; at most %d", len(r.RequestURI), MaxRequestURI), http.StatusRequestURITooLong)
		return
	}
	switch r.URL.Path {
	case "/healthz":
		m.probe(w, r, nil)
		return
	case "/readyz":
		m.probe(w, r, m.Ready)
		return
	case "/metrics":
		m.log.Debug().Str("path", r.URL.Path).Str("client", r.RemoteAddr).Msg("probe")
		m.MetricsHandler().ServeHTTP(w, r)
		return
	case mirrorapi.PeersPath:
		m.servePeers(w, r)
		return
	case mirrorapi.UpstreamsPath:
		m.serveUpstreams(w, r)
		return
	case mirrorapi.ClientsPath:
		if !m.clients.allowed(r.RemoteAddr) {
			m.metrics.refused.WithLabelValues(RefusedAllow).Inc()
		}
		m.clients.serveHTTP(w, r)
		return
	}
	if r.URL.Path == mirrorapi.CachePath || strings.HasPrefix(r.URL.Path, mirrorapi.CachePath+"/") {
		m.serveCache(w, r)
		return
	}
	if r.URL.Path != "/v2" && !strings.HasPrefix(r.URL.Path, "/v2/") {
		errNotFound("NOT_FOUND", "not a registry API path: "+r.URL.Path).write(w)
		return
	}
	m.serveRegistry(w, r)
}

func (m *Mirror) probe(w http.ResponseWriter, r *http.Request, check func(context.Context) error) {
	m.log.Debug().Str("path", r.URL.Path).Str("client", r.RemoteAddr).Msg("probe")
	if check != nil {
		if err := check(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (m *Mirror) serveRegistry(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &responseWriter{ResponseWriter: w}
	var (
		rt  = route{kind: kindOther}
		out outcome
		err error
	)
	// Client evidence is recorded as the headers go out, before the client can see the answer.
	rw.onHeader = func(code int) {
		if !fromPeer(r) { // a member's request is not evidence of this node's runtime
			m.clients.record(r.RemoteAddr, r.UserAgent(), IsContent(r.Method, rt.kind, code), time.Now())
		}
		if code < 400 && rt.up != nil && (rt.kind == kindManifest || rt.kind == kindBlob) {
			m.metrics.firstByte.WithLabelValues(rt.up.Name, rt.kind, rw.Header().Get(mirrorapi.HeaderCache)).Observe(time.Since(start).Seconds())
		}
	}
	defer func() {
		rec := recover()
		if rec != nil && rec != http.ErrAbortHandler { //nolint:errorlint // net/http's sentinel is compared, not wrapped
			m.recovered(rw, r, rec)
		}
		m.logRequest(r, rw, rt, out, start)
		if rec != nil && !rw.recovered {
			// Headers (and maybe part of a body) were out, or it is the abort sentinel: cut the
			// connection so the client sees a broken transfer.
			panic(http.ErrAbortHandler)
		}
	}()

	via, refused := m.refuseRequest(w, rw, r, &rt)
	if refused {
		return
	}
	if r.URL.Path == "/v2" {
		r.URL.Path = "/v2/"
	}
	var apiErr *apiError
	rt, apiErr = m.resolve(r)
	if apiErr != nil {
		apiErr.write(rw)
		return
	}
	switch {
	case rt.kind == kindBase:
		serveBase(rw)
		return
	case rt.repo == mirrorapi.CanaryRepository:
		m.canary.serve(rw, r, rt)
		return
	}
	out, err = m.read(upstream.WithVia(r.Context(), via), rw, r, rt)
	if errors.Is(err, upstream.ErrBroken) {
		// Headers and part of the body are out: abort the connection so the short body is seen
		// as the broken transfer it is (the deferred log line still reports the request).
		panic(http.ErrAbortHandler)
	}
	if err != nil {
		asReadError(err).write(rw)
	}
}

// readRepository answers a read of rt's repository (manifest, blob, tag list or referrers list) and returns how it was
// answered. Every answer carries distribution's API version header, as the registry it
// stores for answers.
//
// Errors: an answer not written yet (a *readError, or an error asReadError turns into one); an
// error wrapping upstream.ErrBroken when a blob's transfer broke after the headers went out.
func (m *Mirror) readRepository(ctx context.Context, w http.ResponseWriter, r *http.Request, rt route) (outcome, error) {
	w.Header().Add("Docker-Distribution-API-Version", "registry/2.0")
	client := rt.repo
	if comps, _, _, _, ok := apiPath(r.URL.Path); ok {
		client = strings.Join(comps, "/")
	}
	repo, err := m.repository(ctx, rt, client)
	if err != nil {
		return outcome{}, err
	}
	switch rt.kind {
	case kindManifest:
		return repo.serveManifest(ctx, w, r, rt.ref)
	case kindBlob:
		return repo.serveBlob(ctx, w, r, rt.ref)
	case kindTags:
		return repo.serveTags(ctx, w, r)
	case kindReferrers:
		return repo.serveReferrers(ctx, w, r, rt.ref)
	}
	return outcome{}, errNotFound("NAME_UNKNOWN", "not a registry read API path: "+r.URL.Path)
}

// refuseRequest answers the requests the registry refuses before routing them: a client outside
// --pull-allow, a method other than GET and HEAD, a request that went round in a loop of
// mirrors; rt gets the kind and reference the path names (for the log and, for the first two,
// the client evidence recorded as the answer goes out). Otherwise it returns the request's Via
// hops.
func (m *Mirror) refuseRequest(w http.ResponseWriter, rw *responseWriter, r *http.Request, rt *route) (via []string, refused bool) {
	if !fromPeer(r) && !m.pull.allowed(r.RemoteAddr) {
		_, rt.kind, rt.ref, _, _ = apiPath(r.URL.Path)
		m.metrics.refused.WithLabelValues(RefusedPullAllow).Inc()
		refusePull(rw, r.RemoteAddr)
		return nil, true
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		_, rt.kind, rt.ref, _, _ = apiPath(r.URL.Path)
		w.Header().Set("Allow", "GET, HEAD")
		(&apiError{Status: http.StatusMethodNotAllowed, Code: "UNSUPPORTED",
			Message: "this registry is a read-only pull-through cache: " + r.Method + " is not supported"}).write(rw)
		return nil, true
	}
	via, loop := m.refuseLoop(rw, r)
	if loop {
		_, rt.kind, rt.ref, _, _ = apiPath(r.URL.Path)
	}
	return via, loop
}

// serveBase answers the base /v2/ check.
func serveBase(w http.ResponseWriter) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	w.Header().Set(mirrorapi.HeaderVersion, buildinfo.Version()) // a chained nodecache forwards ?ns= to us
	w.Header().Set("Content-Type", "application/json")           // byte for byte what distribution answers
	w.Header().Set("Content-Length", "2")
	setCacheHeader(w, outcome{})
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("{}"))
}

// responseWriter records status and bytes, calls onHeader as the headers go out, and keeps
// X-Nodecache-Cache off error answers (http.ServeContent answers 416 after the handler set it).
type responseWriter struct {
	http.ResponseWriter
	status    int
	bytes     int64
	recovered bool // a panic was answered with a 500
	// onHeader, when set, is called with the status just before the headers are written.
	onHeader func(code int)
}

func (w *responseWriter) WriteHeader(code int) {
	if w.status != 0 {
		return
	}
	w.status = code
	if code >= 400 {
		w.Header().Del(mirrorapi.HeaderCache)
	}
	if w.onHeader != nil {
		w.onHeader(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

// ReadFrom keeps the server's own ReaderFrom (sendfile for files) in the path.
func (w *responseWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := io.Copy(w.ResponseWriter, r)
	w.bytes += n
	return n, err
}

// Flush lets streaming responses reach the client as they are written.
func (w *responseWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// recovered answers a panic of the handler: a 500 with an OCI error body when no header went out
// yet, and one error log line with the panic and its stack either way.
func (m *Mirror) recovered(w *responseWriter, r *http.Request, rec any) {
	headersOut := w.status != 0
	if !headersOut {
		w.recovered = true
		(&apiError{Status: http.StatusInternalServerError, Code: "UNKNOWN",
			Message: "internal error while answering this request; see the nodecache log"}).write(w)
	}
	m.log.Error().Str("method", r.Method).Str("path", r.URL.Path).Str("query", r.URL.RawQuery).
		Int("status", w.status).Bool("headers_already_sent", headersOut).
		Str("panic", fmt.Sprint(rec)).Str("stack", string(debug.Stack())).Msg("handler panicked")
}

// logRequest writes the access-log line and updates metrics and client evidence.
func (m *Mirror) logRequest(r *http.Request, w *responseWriter, rt route, out outcome, start time.Time) {
	status := w.status
	if status == 0 {
		status = http.StatusOK
	}
	upName := ""
	if rt.up != nil {
		upName = rt.up.Name
	}
	cache := ""
	if status < 400 {
		cache = out.header()
	}
	m.metrics.requests.WithLabelValues(upName, rt.kind, methodLabel(r.Method), fmt.Sprint(status), cache).Inc()
	fromUp := min(out.upBytes, w.bytes)
	if w.bytes-fromUp > 0 {
		m.metrics.servedBytes.WithLabelValues(upName, "cache").Add(float64(w.bytes - fromUp))
	}
	if fromUp > 0 {
		source := upstream.TierUpstream
		if out.tier == upstream.TierShared || out.tier == upstream.TierPeer {
			source = out.tier
		}
		m.metrics.servedBytes.WithLabelValues(upName, source).Add(float64(fromUp))
	}
	if w.status == 0 {
		w.onHeader(status) // nothing was written: net/http sends an empty 200
	}
	ev := m.log.Info()
	if sender := peerSender(r); sender != "" {
		ev = ev.Str("peer", sender) // only a member's request names one
	}
	ev.
		Str("method", r.Method).
		Str("upstream", upName).
		Str("repository", rt.repo).
		Str("kind", rt.kind).
		Str("reference", rt.ref).
		Int("status", status).
		Int64("bytes", w.bytes).
		Float64("duration_ms", float64(time.Since(start).Microseconds())/1000).
		Str("cache", cache).
		Str("tier", out.tier).
		Str("client", r.RemoteAddr).
		Str("user_agent", r.UserAgent()).
		Str("path", r.URL.Path).
		Str("query", r.URL.RawQuery).
		Msg("request")
}

// Root is the storage directory ("" for in-memory storage).
func (m *Mirror) Root() string { return m.opts.Root }

// methodLabel is the method label of nodecache_requests_total: the method for RFC 9110's
// methods, "other" for anything else, so a client cannot make a series per made-up method.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}
