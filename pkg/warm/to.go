package warm

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	ggcrname "github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

// BundleOptions is warm --to: write the images into a bundle directory (package bundle)
// straight from their upstream registries, with no cache running.
type BundleOptions struct {
	// Dir is the bundle directory (--to); see bundle.Create for what it may already hold.
	Dir string
	// Format is the bundle's layout (--format). Default bundle.FormatOCI.
	Format bundle.Format
	// Upstreams say where each registry's API is reached, as serve's --upstream does
	// (name.ParseUpstreams). Default name.DefaultUpstreams(), serve's default set. Every image's
	// registry must be one of them (aliases count: docker.io, index.docker.io).
	Upstreams []name.Upstream
	// Credentials authenticate warm to upstreams, by upstream name (--upstream-auth;
	// upstreamauth.Load); they are sent only to that upstream and its token realm
	// (upstreamauth.Guard). Upstreams without an entry are asked anonymously, with the anonymous
	// tokens real registries hand out.
	Credentials map[string]*upstreamauth.Credentials
	// RootCAs are the certificate authorities trusted for TLS to an upstream, its token realm and
	// its redirects, by upstream name (--upstream-ca; upstreamauth.LoadRootCAs: the system's plus
	// a private CA). Needs an *http.Transport as Options.Transport. Absent: the system's.
	RootCAs map[string]*x509.CertPool
	// AllPlatforms keeps every manifest of an index (--platform all): each platform's image and
	// the attestation manifests, so the index is whole. Otherwise only Options.Platform's
	// manifest (chosen by Options.PlatformMatch) is stored with its blobs, under the index
	// as the upstream serves it (image-spec image-layout.md: a layout MAY be missing blobs).
	AllPlatforms bool
}

// setDefaults fills the defaults and checks that an upstream serves every image of images.
func (b *BundleOptions) setDefaults(images []Reference) error {
	var errs []error
	if b.Dir == "" {
		errs = append(errs, refusal.Value("--to", "", "want a directory to write the bundle into"))
	}
	f, err := bundle.ParseFormat(string(b.Format))
	errs = append(errs, err)
	b.Format = f
	if len(b.Upstreams) == 0 {
		b.Upstreams = name.DefaultUpstreams()
	}
	known := map[string]name.Upstream{}
	var names []string
	for _, u := range b.Upstreams {
		known[name.Canonical(u.Name)] = u
		names = append(names, u.Name)
	}
	for _, ref := range images {
		switch u, ok := known[name.Canonical(ref.Registry)]; {
		case !ok:
			errs = append(errs, refusal.Errorf("image %s: its registry %s is not an --upstream (configured: %s); add --upstream %s or --upstream %s=URL",
				ref, ref.Registry, strings.Join(names, ", "), ref.Registry, ref.Registry))
		case u.Offline || u.URL == nil:
			errs = append(errs, refusal.Errorf("image %s: its upstream is --upstream %s, which is never asked; warm --to fetches from the upstream: give --upstream %s or --upstream %s=URL",
				ref, u, u.Name, u.Name))
		}
	}
	return errors.Join(errs...)
}

// BundleReport is what warm --to wrote.
type BundleReport struct {
	// Dir and Format are the bundle's directory and layout.
	Dir    string        `json:"dir"`
	Format bundle.Format `json:"format"`
	// Existing: Dir held a bundle listing images already; those not written now are kept.
	Existing bool `json:"existing"`
	// Written: the images were made visible (index.json, or the Talos manifests tree,
	// written). False when any image failed or the run was stopped: then nothing of this run
	// is listed, and the blobs stored are reused by the next run into Dir.
	Written bool `json:"written"`
}

func (b *BundleReport) describe() string {
	s := fmt.Sprintf("bundle %s (%s", b.Dir, b.Format)
	if b.Existing {
		s += ", added to the images it held"
	}
	return s + ")"
}

func (b *BundleReport) outcome() string {
	if b.Written {
		if b.Format == bundle.FormatTalosFlat {
			return "bundle written: manifests/ lists every image"
		}
		return "bundle written: index.json lists every image"
	}
	return "bundle NOT written: no image of this run is listed in it; the blobs stored are verified and kept for the next run into the same directory"
}

// runBundle is Run for warm --to (opts checked). The returned error is only for a bundle
// directory that cannot be used (refused: errors.Is(err, ErrRefused)); images that fail, a run
// stopped, and a bundle that could not be committed are in the report, with Bundle.Written
// false.
func runBundle(ctx context.Context, opts Options) (*Report, error) {
	start := time.Now()
	b := opts.Bundle
	out, err := bundle.Create(b.Dir, b.Format)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	if opts.Deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, opts.Deadline, errDeadline{opts.Deadline})
		defer cancel()
	}
	platform := FormatPlatform(opts.Platform)
	if b.AllPlatforms {
		platform = "all"
	}
	rep := &Report{
		Bundle:   &BundleReport{Dir: out.Dir(), Format: out.Format(), Existing: out.Existing()},
		Platform: platform, PlatformMatch: opts.PlatformMatch, Talos: opts.Talos, Images: make([]ImageReport, len(opts.Images)),
	}
	for i, ref := range opts.Images {
		rep.Images[i] = ImageReport{Input: ref.Input, Reference: ref.String()}
	}
	ups, err := upstreamClients(&opts)
	if err != nil {
		return nil, err
	}

	prog, stopBar := startProgress(ctx, &opts)
	w := &walker{opts: &opts, prog: prog, matcher: newPlatformMatcher(opts.Platform, opts.PlatformMatch),
		sem: make(chan struct{}, opts.Concurrency), blobs: map[string]blobOutcome{},
		out: out, ups: ups, all: b.AllPlatforms, stored: map[string]v1.Descriptor{}}
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

	w.commit(ctx, opts.Images, rep)
	if err := out.Close(); err != nil && rep.Error == "" {
		rep.Error = err.Error()
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// upstreamClients is a client for each upstream of opts.Bundle that is not offline, by
// name.Canonical of its name.
func upstreamClients(opts *Options) (map[string]*client, error) {
	ups := map[string]*client{}
	for _, u := range opts.Bundle.Upstreams {
		if u.Offline || u.URL == nil {
			continue // no image of the run is of it (setDefaults)
		}
		c, err := newUpstreamClient(u, opts)
		if err != nil {
			return nil, err
		}
		ups[name.Canonical(u.Name)] = c
	}
	return ups, nil
}

// commit lists every image stored in the bundle, in the order given (the order of
// index.json), and writes it (bundle.Writer.Commit) when all of them are and the run was not
// stopped; rep says which.
func (w *walker) commit(ctx context.Context, images []Reference, rep *Report) {
	out := w.out
	for i, ref := range images {
		if !rep.Images[i].Warm {
			continue
		}
		img := bundle.Image{Registry: ref.Registry, Repository: ref.Repository, Tag: ref.Tag, Manifest: w.stored[ref.String()]}
		if err := out.Add(img); err != nil {
			rep.Images[i].Warm, rep.Images[i].Error = false, err.Error()
		}
	}
	rep.Warm = true
	for i := range rep.Images {
		rep.Warm = rep.Warm && rep.Images[i].Warm
	}
	rep.countBlobs(w.blobs)
	switch {
	case ctx.Err() != nil:
		rep.Error = fmt.Sprintf("stopped: %v", context.Cause(ctx))
	case rep.Warm:
		if err := out.Commit(); err != nil {
			rep.Error = fmt.Sprintf("write bundle: %v", err)
		} else {
			rep.Bundle.Written = true
		}
	}
}

// storeManifests stores every manifest walked for ref in the bundle.
func (w *walker) storeManifests(ref Reference, docs []manifestDoc) error {
	for _, doc := range docs {
		if err := w.out.Manifest(ref.Registry, ref.Repository, doc.descriptor(), doc.Body); err != nil {
			return err
		}
	}
	return nil
}

// descriptor describes the manifest: media type, digest, size.
func (m manifestDoc) descriptor() v1.Descriptor {
	return v1.Descriptor{MediaType: m.MediaType, Size: int64(len(m.Body)),
		Digest: v1.Hash{Algorithm: m.Digest.Algorithm().String(), Hex: m.Digest.Encoded()}}
}

// storeBlob puts blob d of ref into the bundle: nothing to do when it is there already
// (verified), else fetched from the upstream into a bundle.BlobFile, which checks it again and
// renames it into place.
func (w *walker) storeBlob(ctx context.Context, ref Reference, d v1.Descriptor) blobOutcome {
	f, err := w.out.Blob(d)
	if err != nil {
		return blobOutcome{err: err}
	}
	if f == nil {
		w.prog.transferred(d.Size)
		return blobOutcome{present: true}
	}
	res, err := w.client(ref).getBlob(ctx, ref, d, w.opts.BlobTimeout, w.prog, f)
	if err != nil {
		f.Abort()
		return blobOutcome{res: res, err: err}
	}
	return blobOutcome{res: res, err: f.Commit()}
}

// getConfig fetches config d of ref into body (to read its platform) and, with warm --to, into
// the bundle as well; a config the bundle holds already (verified) is read from there.
func (w *walker) getConfig(ctx context.Context, ref Reference, d v1.Descriptor, body *bytes.Buffer) blobOutcome {
	if w.out == nil {
		res, err := w.c.getBlob(ctx, ref, d, w.opts.BlobTimeout, w.prog, bufferSink{body})
		return blobOutcome{res: res, err: err}
	}
	f, err := w.out.Blob(d)
	if err != nil {
		return blobOutcome{err: err}
	}
	if f == nil {
		b, err := w.out.ReadBlob(d)
		body.Write(b)
		w.prog.transferred(d.Size)
		return blobOutcome{present: err == nil, err: err}
	}
	res, err := w.client(ref).getBlob(ctx, ref, d, w.opts.BlobTimeout, w.prog, teeSink{bufferSink{body}, f})
	if err != nil {
		f.Abort()
		return blobOutcome{res: res, err: err}
	}
	return blobOutcome{res: res, err: f.Commit()}
}

// newUpstreamClient is a client for upstream u: requests go to u.URL itself, each repository
// authenticated as go-containerregistry does it (transport.NewWithContext: a /v2/ ping, then
// for a bearer challenge a token with pull scope from the announced realm, anonymous as
// docker.io, ghcr.io, quay.io and registry.k8s.io hand out, or with u's Credentials; refreshed
// on 401), trusting u's RootCAs.
func newUpstreamClient(u name.Upstream, opts *Options) (*client, error) {
	nopts := []ggcrname.Option{ggcrname.WeakValidation}
	if u.URL.Scheme == "http" {
		nopts = append(nopts, ggcrname.Insecure)
	}
	reg, err := ggcrname.NewRegistry(u.URL.Host, nopts...)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: URL host %q: %w", u.Name, u.URL.Host, err)
	}
	next, err := upstreamauth.WithRootCAs(opts.Transport, opts.Bundle.RootCAs[u.Name])
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", u.Name, err)
	}
	var creds authn.Authenticator = authn.Anonymous
	if c := opts.Bundle.Credentials[u.Name]; c != nil {
		creds, next = c, upstreamauth.Guard(u.Name, u.URL, next)
	}
	base := transport.NewUserAgent(schemeTransport{host: u.URL.Host, scheme: u.URL.Scheme, next: next}, opts.UserAgent)
	return &client{
		base: u.URL, routing: routingDirect, upstream: u.Name, privateCA: opts.Bundle.RootCAs[u.Name] != nil,
		hc:        &http.Client{CheckRedirect: noDowngrade},
		auth:      &upstreamAuth{reg: reg, creds: creds, base: base, repos: map[string]http.RoundTripper{}},
		userAgent: opts.UserAgent, retries: opts.Retries,
		backoff: opts.Backoff, maxDelay: opts.MaxBackoff, log: opts.Logger,
	}, nil
}

// upstreamAuth holds one upstream's authenticated transport per repository.
type upstreamAuth struct {
	reg   ggcrname.Registry
	creds authn.Authenticator
	base  http.RoundTripper
	group singleflight.Group
	mu    sync.Mutex
	repos map[string]http.RoundTripper
}

// transport returns repo's transport, creating it once (concurrent callers share the
// creation). A refusal by the registry (4xx but 408 and 429) is permanent; anything else
// (network, 5xx) is retried by the caller.
func (a *upstreamAuth) transport(ctx context.Context, repo string) (http.RoundTripper, error) {
	a.mu.Lock()
	rt, ok := a.repos[repo]
	a.mu.Unlock()
	if ok {
		return rt, nil
	}
	v, err, _ := a.group.Do(repo, func() (any, error) {
		rt, err := transport.NewWithContext(ctx, a.reg, a.creds, a.base, []string{"repository:" + repo + ":pull"})
		if err != nil {
			err = fmt.Errorf("authenticate to %s for %s: %w", a.reg.Name(), repo, err)
			var te *transport.Error
			if errors.As(err, &te) && te.StatusCode >= 400 && te.StatusCode < 500 && !slices.Contains([]int{http.StatusRequestTimeout, http.StatusTooManyRequests}, te.StatusCode) {
				return nil, permanent(err)
			}
			return nil, err
		}
		a.mu.Lock()
		a.repos[repo] = rt
		a.mu.Unlock()
		return rt, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(http.RoundTripper), nil
}

// schemeTransport sends every request to the upstream's own host with the scheme its URL
// names. go-containerregistry pings a registry over https and, for an insecure or loopback
// one, over http too (transport.Ping): the configured scheme is the contract, so neither an
// https handshake reaches a plain-HTTP upstream nor http an https one.
type schemeTransport struct {
	host, scheme string
	next         http.RoundTripper
}

func (t schemeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host == t.host && req.URL.Scheme != t.scheme {
		r := req.Clone(req.Context())
		r.URL.Scheme = t.scheme
		req = r
	}
	return t.next.RoundTrip(req)
}

// noDowngrade follows at most 10 redirects (net/http's bound), never from https to http: a
// blob's bytes are checked against its digest either way, but the request's path and query
// (a signed CDN URL) are not sent in the clear.
func noDowngrade(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Scheme == "http" && via[len(via)-1].URL.Scheme == "https" {
		return permanent(fmt.Errorf("redirect from %s to %s refused: https to http", via[len(via)-1].URL.Host, req.URL.Host))
	}
	return nil
}
