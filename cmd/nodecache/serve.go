package main

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/pkg/mirror"
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

Examples:
   nodecache serve --root /var/lib/nodecache
   nodecache serve --upstream ghcr.io=https://ghcr.io --upstream docker.io=https://registry-1.docker.io
   NODECACHE_LISTEN=127.0.0.1:5000 nodecache serve`,
		Flags: mirrorFlags(":5000"),
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
			mirror.ForwardDistributionLogs(log)
			m, err := mirror.New(c.Context, opts)
			if err != nil {
				return withCode(exitNegative, err)
			}
			log.Info().Str("version", buildinfo.Version()).Msg("nodecache serve")
			err = mirror.Serve(c.Context, m, mirror.ServeOptions{
				Listen: c.String("listen"), MetricsListen: c.String("metrics-listen"), Logger: log,
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
	var allow []netip.Prefix
	for _, s := range splitList(c.StringSlice("allow")) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return mirror.Options{}, usagef("--allow %q: want a CIDR such as 10.0.0.0/8: %v", s, err)
		}
		allow = append(allow, p)
	}
	o := mirror.Options{
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
