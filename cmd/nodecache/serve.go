package main

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/name"
)

func defaultUpstreamSpecs() []string {
	var out []string
	for _, u := range name.DefaultUpstreams() {
		out = append(out, u.String())
	}
	return out
}

// mirrorFlags are the flags of the embedded registry, shared by serve and agent.
func mirrorFlags(listenDefault string) []cli.Flag {
	return append([]cli.Flag{
		stringFlag("listen", listenDefault, "registry listen `ADDR`"),
		stringFlag("root", mirror.DefaultRoot, "storage `DIR` (filesystem); created if missing"),
		stringSliceFlag("upstream", defaultUpstreamSpecs(),
			"`NAME=URL` of a registry to pull through, repeatable; replaces the default set. NAME is the registry host as written in image references (containerd sends it as ?ns=), URL where its API is reached"),
		stringFlag("default-upstream", "", "upstream `NAME` for requests with neither ?ns= nor a /v2/<NAME>/ prefix (default: docker.io when configured, else none)"),
		durationFlag("upstream-timeout", mirror.DefaultUpstreamTimeout, "bound on an upstream answer (headers) and a stalled blob stream; then a cached tag is served as stale"),
		durationFlag("tag-ttl", 0, "serve a cached tag this long without asking the upstream (0: revalidate on every request)"),
		stringFlag("metrics-listen", "", "also serve /metrics, /healthz and /readyz on this `ADDR`"),
		stringSliceFlag("allow", nil, "`CIDR` allowed to read /nodecache/v1/clients besides loopback, repeatable"),
		stringSliceFlag("pull-allow", nil, "`CIDR` allowed to pull (every /v2/ request), repeatable; 127.0.0.1 and ::1 always are; anyone else gets 403 DENIED. Default: every address that reaches the port (said once at start on a non-loopback listener). /healthz, /readyz and /metrics stay open"),
		stringSliceFlag("upstream-auth", nil, "`NAME=FILE`: pull upstream NAME with the credentials for NAME in FILE, a docker config.json or Kubernetes .dockerconfigjson (auths, credHelpers, credsStore; helpers run from PATH), repeatable. Read again when the file changes. WARNING: everything these credentials can read becomes readable by every client that may pull through the cache: set --pull-allow"),
		stringSliceFlag("upstream-ca", nil, "`NAME=FILE`: also trust the PEM CA certificates in FILE for upstream NAME (its token realm and redirects included), repeatable"),
	}, logFlags()...)
}

func serveCommand() *cli.Command {
	return withConfig(&cli.Command{
		Name:  "serve",
		Usage: "run the pull-through registry for many upstreams on one port",
		Description: `Serves the OCI distribution API read-only and fills its cache from the configured upstreams.

Routing: containerd sends ?ns=<registry> (hosts.toml); CRI-O and other clients use a path
prefix /v2/<registry>/<repository>/...; anything else goes to --default-upstream.
Only configured upstreams are ever contacted.

Who may pull: every address that reaches --listen, unless --pull-allow CIDR is given; then only
127.0.0.1, ::1 and those networks (anyone else: 403 DENIED, counted in
nodecache_refused_total{reason="pull_allow"}). /healthz, /readyz and /metrics stay open;
/nodecache/v1/clients is answered to loopback and --allow networks only.

Upstream credentials: --upstream-auth NAME=FILE reads NAME's entry from a docker config.json or
a Kubernetes .dockerconfigjson as docker does (Docker Hub under https://index.docker.io/v1/;
credHelpers/credsStore run docker-credential-* from PATH), and re-reads the file when it changes.
They are sent only to that upstream and an https token realm on its registrable domain, and
never logged. Everything they can read becomes readable by every client that may pull: set
--pull-allow. An upstream that refuses nodecache (401/403) makes the client's answer 403 DENIED,
so containerd falls back to the registry with the node's own pull secrets.

HTTPS_PROXY/HTTP_PROXY/NO_PROXY apply to upstream traffic; --upstream-ca NAME=FILE trusts a
private CA. --tls-cert/--tls-key serve HTTPS (TLS 1.2+), re-read when the files change.

Examples:
   nodecache serve --root /var/lib/nodecache
   nodecache serve --upstream ghcr.io=https://ghcr.io --upstream docker.io=https://registry-1.docker.io
   NODECACHE_LISTEN=127.0.0.1:5000 nodecache serve`,
		Flags: append(mirrorFlags(":5000"),
			stringFlag("tls-cert", "", "serve HTTPS (TLS 1.2+) on --listen with the PEM certificate (chain) in `FILE`; needs --tls-key; both read again when they change"),
			stringFlag("tls-key", "", "PEM private key `FILE` of --tls-cert"),
		),
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			opts, err := mirrorOptions(c)
			if err != nil {
				return err
			}
			opts.Logger = log
			cert, err := listenerTLS(c, log)
			if err != nil {
				return err
			}
			mirror.ForwardDistributionLogs(log)
			m, err := mirror.New(c.Context, opts)
			if err != nil {
				return withCode(exitNegative, err)
			}
			log.Info().Str("version", buildinfo.Version()).Msg("nodecache serve")
			err = mirror.Serve(c.Context, m, mirror.ServeOptions{
				Listen: c.String("listen"), MetricsListen: c.String("metrics-listen"), Logger: log, TLS: cert,
			})
			if cerr := m.Close(); err == nil {
				err = cerr
			}
			return withCode(exitNegative, err)
		},
	})
}

// mirrorOptions binds the registry flags; refusals exit 2.
func mirrorOptions(c *cli.Context) (mirror.Options, error) {
	ups, err := name.ParseUpstreams(splitList(c.StringSlice("upstream")))
	if err != nil {
		return mirror.Options{}, usagef("--upstream: %v", err)
	}
	allow, err := parseCIDRs("allow", c.StringSlice("allow"))
	if err != nil {
		return mirror.Options{}, err
	}
	pullAllow, err := parseCIDRs("pull-allow", c.StringSlice("pull-allow"))
	if err != nil {
		return mirror.Options{}, err
	}
	log, err := newLogger(c)
	if err != nil {
		return mirror.Options{}, err
	}
	creds := map[string]*upstream.Credentials{}
	for _, spec := range splitList(c.StringSlice("upstream-auth")) {
		n, file, err := upstreamFileSpec("upstream-auth", spec, ups)
		if err != nil {
			return mirror.Options{}, err
		}
		cr, err := upstream.LoadCredentials(file, n, upstream.CredentialsOptions{Logger: log})
		if err != nil {
			return mirror.Options{}, usagef("--upstream-auth %s: %v", n, err)
		}
		creds[n] = cr
	}
	cas := map[string]*x509.CertPool{}
	for _, spec := range splitList(c.StringSlice("upstream-ca")) {
		n, file, err := upstreamFileSpec("upstream-ca", spec, ups)
		if err != nil {
			return mirror.Options{}, err
		}
		pool, err := upstream.LoadRootCAs(file)
		if err != nil {
			return mirror.Options{}, usagef("--upstream-ca %s: %v", n, err)
		}
		cas[n] = pool
	}
	o := mirror.Options{
		PullAllow:           pullAllow,
		UpstreamCredentials: creds,
		UpstreamRootCAs:     cas,
		Root:                c.String("root"),
		Upstreams:           ups,
		DefaultUpstream:     c.String("default-upstream"),
		UpstreamTimeout:     c.Duration("upstream-timeout"),
		TagTTL:              c.Duration("tag-ttl"),
		ClientEvidenceAllow: allow,
	}
	if o.Root == "" {
		return o, usagef("--root: a storage directory is required")
	}
	for _, name := range []string{"listen", "metrics-listen"} {
		if v := c.String(name); v != "" || name == "listen" {
			if err := checkListen(v); err != nil {
				return o, usagef("--%s %q: %v", name, v, err)
			}
		}
	}
	if o.UpstreamTimeout <= 0 {
		return o, usagef("--upstream-timeout %s: want a positive duration such as 10s", o.UpstreamTimeout)
	}
	if o.TagTTL < 0 {
		return o, usagef("--tag-ttl %s: want 0 or a positive duration", o.TagTTL)
	}
	if o.DefaultUpstream != "" {
		n, err := name.ParseRegistry(o.DefaultUpstream)
		if err != nil {
			return o, usagef("--default-upstream: %v", err)
		}
		found := false
		for _, u := range ups {
			found = found || name.Canonical(u.Name) == name.Canonical(n)
		}
		if !found {
			return o, usagef("--default-upstream %q is not among --upstream names %s", n, strings.Join(upstreamNames(ups), ", "))
		}
	}
	return o, nil
}

// parseCIDRs parses the values of a repeatable CIDR flag; refusals exit 2.
func parseCIDRs(flag string, values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range splitList(values) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, usagef("--%s %q: want a CIDR such as 10.0.0.0/8 or fd00::/8: %v", flag, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// upstreamFileSpec splits NAME=FILE of --upstream-auth and --upstream-ca; NAME must be a
// configured upstream (aliases such as index.docker.io name docker.io).
func upstreamFileSpec(flag, spec string, ups []name.Upstream) (string, string, error) {
	n, file, ok := strings.Cut(spec, "=")
	if !ok || n == "" || file == "" {
		return "", "", usagef("--%s %q: want NAME=FILE, e.g. ghcr.io=/etc/nodecache/config.json", flag, spec)
	}
	reg, err := name.ParseRegistry(n)
	if err != nil {
		return "", "", usagef("--%s %q: %v", flag, spec, err)
	}
	for _, u := range ups {
		if u.Name == reg || (name.Canonical(u.Name) == name.DockerHub && name.Canonical(reg) == name.DockerHub) {
			return u.Name, file, nil
		}
	}
	return "", "", usagef("--%s %q: %s is not among the --upstream names %s", flag, spec, reg, strings.Join(upstreamNames(ups), ", "))
}

// listenerTLS loads --tls-cert and --tls-key (both or neither); refusals exit 2.
func listenerTLS(c *cli.Context, log zerolog.Logger) (*mirror.Certificate, error) {
	cert, key := c.String("tls-cert"), c.String("tls-key")
	switch {
	case cert == "" && key == "":
		return nil, nil
	case cert == "" || key == "":
		return nil, usagef("--tls-cert and --tls-key go together: give both PEM files, or neither for plain HTTP")
	}
	crt, err := mirror.LoadCertificate(cert, key, log)
	if err != nil {
		return nil, usagef("--tls-cert/--tls-key: %v", err)
	}
	return crt, nil
}

// checkListen accepts HOST:PORT or :PORT with a port from 0 to 65535 (0: any free port).
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want HOST:PORT or :PORT, e.g. :5000 or 127.0.0.1:5000")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	return nil
}

// splitList accepts repeated values and comma-separated lists alike (env and YAML give the
// latter).
func splitList(in []string) []string {
	var out []string
	for _, s := range in {
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func upstreamNames(ups []name.Upstream) []string {
	out := make([]string, len(ups))
	for i, u := range ups {
		out[i] = u.Name
	}
	return out
}
