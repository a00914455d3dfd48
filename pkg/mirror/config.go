package mirror

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/mirror/peer"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

// Config is the embedded registry's settings as serve and agent take them on the command line:
// strings and lists still to be checked. Options turns them into Options; its errors name the
// flag (--listen, --upstream, ...) and what it accepts.
type Config struct {
	// Listen and MetricsListen are --listen and --metrics-listen: HOST:PORT or :PORT.
	// MetricsListen may be empty (no second listener).
	Listen, MetricsListen string
	// Root is --root, the storage directory.
	Root string
	// Upstreams are --upstream values NAME=URL (or NAME=offline), repeated or comma-separated.
	Upstreams []string
	// Offline is --offline: every upstream is offline, served from the cache only and never
	// asked (as NAME=offline; offline.go).
	Offline bool
	// DefaultUpstream is --default-upstream, one of the upstream names or empty.
	DefaultUpstream string
	// UpstreamTimeout (positive) and TagTTL (0 or positive) are --upstream-timeout and --tag-ttl.
	UpstreamTimeout, TagTTL time.Duration
	// UpstreamConcurrency is --upstream-concurrency: requests per upstream waiting for its
	// response headers at once (0: the default, upstream.DefaultConcurrency; negative is
	// refused).
	UpstreamConcurrency int
	// FillTimeout is --fill-timeout: the longest one blob fill may take; positive (0 and
	// negative values are refused: the flag's default is upstream.DefaultFillTimeout).
	FillTimeout time.Duration
	// MaxSize is --max-size: binary units (30GiB) or a share of --root's filesystem (30%);
	// empty: no cap. See ParseMaxSize.
	MaxSize string
	// Allow are --allow CIDRs, repeated or comma-separated.
	Allow []string
	// PullAllow are --pull-allow CIDRs (who may pull besides loopback), repeated or
	// comma-separated. Empty: everyone who reaches the port.
	PullAllow []string
	// UpstreamAuth and UpstreamCA are --upstream-auth and --upstream-ca values NAME=FILE: a
	// docker config.json (or .dockerconfigjson) and a PEM CA bundle for upstream NAME.
	UpstreamAuth, UpstreamCA []string
	// TLSCert and TLSKey are --tls-cert and --tls-key (both or neither): serve HTTPS.
	TLSCert, TLSKey string
	// Chain is --chain: http(s)://HOST[:PORT] of a shared nodecache, or empty.
	Chain string
	// Storage is --storage: filesystem (default, under Root) or s3.
	Storage string
	// S3 holds --s3-bucket, --s3-region, --s3-endpoint, --s3-path-style and
	// --s3-root-directory; S3Profile is --s3-profile (the AWS shared-config profile: Options
	// sets AWS_PROFILE and AWS_SDK_LOAD_CONFIG=1 in the process environment).
	S3        S3Storage
	S3Profile string
	// UpstreamAllowPrivate are --upstream-allow-private CIDRs: networks an upstream's redirect
	// or token realm may lead to although they are not public addresses.
	UpstreamAllowPrivate []string
	// MaxUnknownBlobSize is --max-unknown-blob-size in binary units (16GiB); empty: the
	// default, upstream.DefaultMaxUnknownBlobSize.
	MaxUnknownBlobSize string
	// Peers is --peers (dns:NAME:PORT, file:PATH or HOST:PORT,...; empty: no peers),
	// PeerListen --peer-listen (HOST:PORT where this node answers its peers; empty: it only
	// asks), PeerKeyFile --peer-key-file (the cluster key; required with either).
	Peers, PeerListen, PeerKeyFile string
	// IdleTimeout is --idle-timeout: keep-alive connections idle this long are closed (0: the
	// default, DefaultIdleTimeout; negative is refused).
	IdleTimeout time.Duration
	// ClientMaxConns is --client-max-conns: connections one address may hold once the
	// connection budget is under pressure (0: the default, DefaultClientMaxConns; negative is
	// refused). For ServeOptions.ClientMaxConns.
	ClientMaxConns int
	// ScrubInterval is --scrub-interval: how often each stored blob is re-hashed; 0 turns the
	// background scrubber off. With --storage s3 it applies only when ScrubIntervalSet (given
	// on the command line, in the environment or the settings file): scrubbing a shared bucket
	// is off unless asked for. ScrubRate is --scrub-rate (ParseRate; "": the default).
	ScrubInterval    time.Duration
	ScrubIntervalSet bool
	ScrubRate        string
	// PeersRefresh and PeerDialTimeout are --peers-refresh and --peer-dial-timeout (positive;
	// required with --peers: the flags default to 10 s and 1 s).
	PeersRefresh, PeerDialTimeout time.Duration
	// Seed is --seed: a bundle directory whose images serve stores at start (Options.Seed).
	// Empty: none.
	Seed string
}

// Options checks c, loads the upstream credentials and CAs, and returns the registry's Options
// (without Logger and metrics registries). log receives the credentials' reloads.
func (c Config) Options(log zerolog.Logger) (Options, error) {
	ups, err := name.ParseUpstreams(clitext.SplitList(c.Upstreams))
	if err != nil {
		return Options{}, err // names --upstream (name.ParseUpstreams)
	}
	if len(ups) == 0 {
		return Options{}, errors.New("--upstream is empty (an empty --upstream or NODECACHE_UPSTREAM= gives none): want NAME[=URL], repeatable or comma-separated, e.g. docker.io or ghcr.io=https://ghcr.io; leave it unset for the default set")
	}
	if c.Offline {
		for i := range ups {
			ups[i].Offline = true // the URL is kept, and never used
		}
	}
	allow, err := parseCIDRs("allow", c.Allow)
	if err != nil {
		return Options{}, err
	}
	pullAllow, err := parseCIDRs("pull-allow", c.PullAllow)
	if err != nil {
		return Options{}, err
	}
	allowPrivate, err := parseCIDRs("upstream-allow-private", c.UpstreamAllowPrivate)
	if err != nil {
		return Options{}, err
	}
	unknownMax, err := parseUnknownBlobSize(c.MaxUnknownBlobSize)
	if err != nil {
		return Options{}, err
	}
	creds, cas, err := upstreamauth.Load(clitext.SplitList(c.UpstreamAuth), clitext.SplitList(c.UpstreamCA), ups, log)
	if err != nil {
		return Options{}, err
	}
	o := Options{PullAllow: pullAllow, UpstreamCredentials: creds, UpstreamRootCAs: cas,
		Root: c.Root, Upstreams: ups, DefaultUpstream: c.DefaultUpstream,
		UpstreamTimeout: c.UpstreamTimeout, UpstreamConcurrency: c.UpstreamConcurrency, TagTTL: c.TagTTL, FillTimeout: c.FillTimeout, ClientEvidenceAllow: allow,
		UpstreamAllowPrivate: allowPrivate, MaxUnknownBlobSize: unknownMax}
	if o.Root == "" {
		return o, errors.New("--root: a storage directory is required")
	}
	if err := checkRoot(o.Root); err != nil {
		return o, err
	}
	if o.MaxSize, err = ParseMaxSize(c.MaxSize, o.Root); err != nil {
		return o, fmt.Errorf("--max-size %w", err)
	}
	if err := c.setStorage(&o); err != nil {
		return o, err
	}
	if c.Chain != "" {
		if o.Chain, err = name.ParseURL("--chain", c.Chain); err != nil {
			return o, err
		}
	}
	if err := c.checkListeners(); err != nil {
		return o, err
	}
	if c.UpstreamConcurrency < 0 {
		return o, fmt.Errorf("--upstream-concurrency %d: want a positive number of requests such as %d", c.UpstreamConcurrency, upstream.DefaultConcurrency)
	}
	if c.ClientMaxConns < 0 {
		return o, fmt.Errorf("--client-max-conns %d: want a positive number of connections such as %d", c.ClientMaxConns, DefaultClientMaxConns)
	}
	if c.IdleTimeout < 0 {
		return o, fmt.Errorf("--idle-timeout %s: want a positive duration such as 30s", c.IdleTimeout)
	}
	if err := o.checkTimes(); err != nil {
		return o, err
	}
	if err := errors.Join(c.setScrub(&o), c.setSeed(&o)); err != nil {
		return o, err
	}
	if o.Peers, err = c.peerOptions(log); err != nil {
		return o, err
	}
	return o, nil
}

// setSeed checks --seed (a directory: what is in it is read in the background once serve
// runs) and sets it in o.
func (c Config) setSeed(o *Options) error {
	switch fi, err := os.Stat(c.Seed); {
	case c.Seed == "":
		return nil
	case err != nil:
		return fmt.Errorf("--seed %s: %w: want a bundle directory (an OCI image layout or a Talos image cache)", c.Seed, err)
	case !fi.IsDir():
		return fmt.Errorf("--seed %s: is %s, not a directory: want a bundle directory (an OCI image layout or a Talos image cache)", c.Seed, inputfile.ModeWords(fi.Mode()))
	}
	o.Seed = c.Seed
	return nil
}

// peerOptions checks the --peer* flags and loads the key: nil without --peers.
func (c Config) peerOptions(log zerolog.Logger) (*PeerOptions, error) {
	switch {
	case c.Peers == "" && c.PeerListen == "" && c.PeerKeyFile != "":
		return nil, errors.New("--peer-key-file is set but --peers is not: give --peers too (the members this node shares blobs with), or drop the key file")
	case c.Peers == "" && c.PeerListen == "":
		return nil, nil
	case c.Peers == "":
		return nil, errors.New("--peer-listen needs --peers: the members this node shares blobs with (dns:NAME:PORT, file:PATH or HOST:PORT,HOST:PORT)")
	case c.PeerKeyFile == "" && c.PeerListen != "":
		return nil, errors.New("--peer-listen needs --peer-key-file: the peer port answers only requests signed with the cluster key (a file of one key of at least 32 bytes, or two lines during a rotation)")
	case c.PeerKeyFile == "":
		return nil, errors.New("--peers needs --peer-key-file: requests to members are signed with the cluster key (a file of one key of at least 32 bytes, or two lines during a rotation)")
	case c.PeersRefresh <= 0 || c.PeerDialTimeout <= 0:
		return nil, fmt.Errorf("--peers-refresh %s and --peer-dial-timeout %s: want positive durations such as 10s and 1s", c.PeersRefresh, c.PeerDialTimeout)
	}
	if c.PeerListen != "" {
		if err := checkListen(c.PeerListen); err != nil {
			return nil, fmt.Errorf("--peer-listen %q: %w", c.PeerListen, err)
		}
		for _, l := range []struct{ name, value string }{{"listen", c.Listen}, {"metrics-listen", c.MetricsListen}} {
			if l.value != "" && sameListener(l.value, c.PeerListen) {
				return nil, fmt.Errorf("--peer-listen %q and --%s %q would bind the same port: give the peer port its own (e.g. :5001)", c.PeerListen, l.name, l.value)
			}
		}
	}
	src, err := peer.ParseSource(c.Peers)
	if err != nil {
		return nil, err // names --peers
	}
	if strings.HasPrefix(c.Peers, "file:") {
		// A list that cannot be read or parsed at start is a mistake to fix now, not a cluster
		// of one that alerts cannot see (later failures keep the last good list).
		if _, err := src.Addresses(context.Background()); err != nil {
			return nil, fmt.Errorf("--peers %s: %w", c.Peers, err)
		}
	}
	keys, err := peer.LoadKeys(c.PeerKeyFile, log)
	if err != nil {
		return nil, fmt.Errorf("--peer-key-file: %w", err)
	}
	return &PeerOptions{Source: src, Keys: keys, Refresh: c.PeersRefresh, DialTimeout: c.PeerDialTimeout}, nil
}

// setStorage sets o's storage (--storage and the --s3-* flags, only with s3) and checks it.
func (c Config) setStorage(o *Options) error {
	o.Storage, o.S3 = c.Storage, c.S3
	switch c.Storage {
	case "", StorageFilesystem:
		if c.S3 != (S3Storage{}) || c.S3Profile != "" {
			return errors.New("--s3-*: only with --storage s3")
		}
	case StorageS3:
		if err := c.S3.validate(); err != nil {
			return err
		}
		if o.MaxSize != 0 { // "0", "0B", "0GiB": no cap, as without the flag
			return errors.New(maxSizeS3)
		}
		if c.S3Profile != "" {
			// The AWS SDK for Go v1 under distribution's s3 driver takes the profile only from
			// the process environment.
			if err := errors.Join(os.Setenv("AWS_PROFILE", c.S3Profile), os.Setenv("AWS_SDK_LOAD_CONFIG", "1")); err != nil {
				return fmt.Errorf("--s3-profile: %w", err)
			}
		}
	default:
		return fmt.Errorf("--storage %q: want filesystem or s3", c.Storage)
	}
	return nil
}

// checkListeners checks --listen and --metrics-listen (when set), which must not be one port.
func (c Config) checkListeners() error {
	for _, l := range []struct{ name, value string }{{"listen", c.Listen}, {"metrics-listen", c.MetricsListen}} {
		if l.value != "" || l.name == "listen" {
			if err := checkListen(l.value); err != nil {
				return fmt.Errorf("--%s %q: %w", l.name, l.value, err)
			}
		}
	}
	if c.MetricsListen != "" && sameListener(c.Listen, c.MetricsListen) {
		return fmt.Errorf("--metrics-listen %q and --listen %q would bind the same port: give --metrics-listen another port (e.g. :9464), or leave it empty, since --listen serves /metrics and the probes too",
			c.MetricsListen, c.Listen)
	}
	return nil
}

// checkTimes checks o's timeouts and TTL, and that the default upstream is one of its upstreams.
func (o *Options) checkTimes() error {
	if o.UpstreamTimeout <= 0 {
		return fmt.Errorf("--upstream-timeout %s: want a positive duration such as 10s", o.UpstreamTimeout)
	}
	if o.TagTTL < 0 {
		return fmt.Errorf("--tag-ttl %s: want 0 or a positive duration", o.TagTTL)
	}
	if o.FillTimeout <= 0 {
		return fmt.Errorf("--fill-timeout %s: want a positive duration such as 2h", o.FillTimeout)
	}
	if o.DefaultUpstream == "" {
		return nil
	}
	n, err := name.ParseRegistry(o.DefaultUpstream)
	if err != nil {
		return fmt.Errorf("--default-upstream: %w", err)
	}
	var names []string
	found := false
	for _, u := range o.Upstreams {
		names = append(names, u.Name)
		found = found || name.Canonical(u.Name) == name.Canonical(n)
	}
	if !found {
		return fmt.Errorf("--default-upstream %q is not among --upstream names %s", n, strings.Join(names, ", "))
	}
	return nil
}

// checkRoot refuses a --root that can never be the storage directory: an existing file that is
// no directory, a path through one (ENOTDIR), a symbolic link to nothing (mkdir cannot create
// its target: "file exists") or a loop of links (ELOOP). A missing directory is fine (created).
func checkRoot(root string) error {
	const want = "want a directory (created if missing)"
	fi, err := os.Stat(root)
	switch {
	case err == nil && !fi.IsDir():
		return fmt.Errorf("--root %s: is %s, not a directory: %s", root, inputfile.ModeWords(fi.Mode()), want)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("--root %s: a part of the path is not a directory: %s", root, want)
	case errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("--root %s: a loop of symbolic links: %s, or a link to one", root, want)
	case errors.Is(err, fs.ErrNotExist):
		// The deepest part of the path that is there: a link there leads to nothing.
		for p := root; ; p = filepath.Dir(p) {
			if _, lerr := os.Lstat(p); lerr == nil {
				if _, serr := os.Stat(p); serr == nil {
					return nil
				}
				target, _ := os.Readlink(p)
				what := "is"
				if p != root {
					what = p + " is"
				}
				return fmt.Errorf("--root %s: %s a symbolic link to %s, which does not exist: %s, or a link to one", root, what, target, want)
			}
			if filepath.Dir(p) == p {
				return nil
			}
		}
	}
	return nil
}

// TLS loads --tls-cert and --tls-key (both or neither: nil for plain HTTP).
func (c Config) TLS(log zerolog.Logger) (*Certificate, error) {
	switch {
	case c.TLSCert == "" && c.TLSKey == "":
		return nil, nil
	case c.TLSCert == "" || c.TLSKey == "":
		return nil, errors.New("--tls-cert and --tls-key go together: give both PEM files, or neither for plain HTTP")
	}
	return LoadCertificate(c.TLSCert, c.TLSKey, log) // its errors name the flag
}

// parseCIDRs parses the values of a repeatable CIDR flag.
func parseCIDRs(flag string, values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range clitext.SplitList(values) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: want a CIDR such as 10.0.0.0/8 or fd00::/8: %w", flag, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// setScrub sets o's scrubbing from --scrub-interval and --scrub-rate (o.Storage set).
func (c Config) setScrub(o *Options) error {
	switch {
	case c.ScrubInterval < 0:
		return fmt.Errorf("--scrub-interval %s: want a positive duration such as 168h (7 days), or 0 for no background scrubbing", c.ScrubInterval)
	case c.ScrubInterval == 0:
		o.ScrubInterval = ScrubOff
	case o.Storage == StorageS3 && !c.ScrubIntervalSet:
		o.ScrubInterval = ScrubOff // a shared bucket is scrubbed only when asked for
	default:
		o.ScrubInterval = c.ScrubInterval
	}
	var err error
	o.ScrubRate, err = ParseRate("--scrub-rate", c.ScrubRate)
	return err
}

// ParseRate parses a rate of reading in bytes a second, as --scrub-rate and cache verify's
// --rate take it: a size in binary units (50MiB, 1GiB, plain bytes), optionally followed by
// "/s". "" is 0 (the caller's default). Errors name flag: decimal units, a share, zero, what does
// not parse.
func ParseRate(flag, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	accepted := "want bytes a second in binary units such as 50MiB or 200MiB/s"
	v := strings.TrimSuffix(s, "/s")
	if strings.HasSuffix(v, "%") {
		return 0, fmt.Errorf("%s %q: a share is not accepted: %s", flag, s, accepted)
	}
	n, err := parseBinarySize(v, accepted)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s %w", flag, err)
	case n == 0:
		return 0, fmt.Errorf("%s %q: must be more than 0: %s", flag, s, accepted)
	}
	return n, nil
}

// parseUnknownBlobSize parses --max-unknown-blob-size: a size in binary units as --max-size
// takes it (no share, no zero); "" is upstream.DefaultMaxUnknownBlobSize.
func parseUnknownBlobSize(s string) (int64, error) {
	if s == "" {
		return upstream.DefaultMaxUnknownBlobSize, nil
	}
	accepted := "want a size in binary units such as 16GiB or 500MiB (the bound of a blob whose size the upstream did not state)"
	if strings.HasSuffix(s, "%") {
		return 0, fmt.Errorf("--max-unknown-blob-size %q: a share is not accepted: %s", s, accepted)
	}
	n, err := parseBinarySize(s, accepted)
	switch {
	case err != nil:
		return 0, fmt.Errorf("--max-unknown-blob-size %w", err)
	case n == 0:
		return 0, fmt.Errorf("--max-unknown-blob-size %q: must be more than 0: %s", s, accepted)
	}
	return n, nil
}

// checkListen accepts HOST:PORT or :PORT with a port from 0 to 65535 (0: any free port).
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want HOST:PORT or :PORT, e.g. :5000 or 127.0.0.1:5000")
	}
	if strings.HasPrefix(addr, "[]") {
		return errors.New("empty brackets (an unset variable such as $(HOST_IP)?) would listen on every interface: want [IPv6]:PORT, HOST:PORT, or :PORT for every interface")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	return nil
}

// sameListener reports whether two checked listen addresses would bind one port: the same
// non-zero port on the same host, or on any host when either is a wildcard (empty, 0.0.0.0,
// ::; Go listens dual-stack there), where the second bind fails with "address already in use".
func sameListener(a, b string) bool {
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	na, _ := strconv.Atoi(pa)
	nb, _ := strconv.Atoi(pb)
	if na == 0 || na != nb {
		return false
	}
	wildcard := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "" || (ip != nil && ip.IsUnspecified())
	}
	if wildcard(ha) || wildcard(hb) {
		return true
	}
	ia, ib := net.ParseIP(ha), net.ParseIP(hb)
	if ia != nil && ib != nil {
		return ia.Equal(ib)
	}
	return strings.EqualFold(ha, hb)
}
