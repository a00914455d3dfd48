package mirror

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/nodecache/nodecache/pkg/name"
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
	// Upstreams are --upstream values NAME=URL, repeated or comma-separated.
	Upstreams []string
	// DefaultUpstream is --default-upstream, one of the upstream names or empty.
	DefaultUpstream string
	// UpstreamTimeout (positive) and TagTTL (0 or positive) are --upstream-timeout and --tag-ttl.
	UpstreamTimeout, TagTTL time.Duration
	// Allow are --allow CIDRs, repeated or comma-separated.
	Allow []string
}

// Options checks c and returns the registry's Options (without Logger and metrics registries).
func (c Config) Options() (Options, error) {
	ups, err := name.ParseUpstreams(SplitList(c.Upstreams))
	if err != nil {
		return Options{}, fmt.Errorf("--upstream: %w", err)
	}
	var allow []netip.Prefix
	for _, s := range SplitList(c.Allow) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Options{}, fmt.Errorf("--allow %q: want a CIDR such as 10.0.0.0/8: %w", s, err)
		}
		allow = append(allow, p)
	}
	o := Options{Root: c.Root, Upstreams: ups, DefaultUpstream: c.DefaultUpstream,
		UpstreamTimeout: c.UpstreamTimeout, TagTTL: c.TagTTL, ClientEvidenceAllow: allow}
	if o.Root == "" {
		return o, errors.New("--root: a storage directory is required")
	}
	for _, l := range []struct{ name, value string }{{"listen", c.Listen}, {"metrics-listen", c.MetricsListen}} {
		if l.value != "" || l.name == "listen" {
			if err := checkListen(l.value); err != nil {
				return o, fmt.Errorf("--%s %q: %w", l.name, l.value, err)
			}
		}
	}
	if o.UpstreamTimeout <= 0 {
		return o, fmt.Errorf("--upstream-timeout %s: want a positive duration such as 10s", o.UpstreamTimeout)
	}
	if o.TagTTL < 0 {
		return o, fmt.Errorf("--tag-ttl %s: want 0 or a positive duration", o.TagTTL)
	}
	if o.DefaultUpstream != "" {
		n, err := name.ParseRegistry(o.DefaultUpstream)
		if err != nil {
			return o, fmt.Errorf("--default-upstream: %w", err)
		}
		var names []string
		found := false
		for _, u := range ups {
			names = append(names, u.Name)
			found = found || name.Canonical(u.Name) == name.Canonical(n)
		}
		if !found {
			return o, fmt.Errorf("--default-upstream %q is not among --upstream names %s", n, strings.Join(names, ", "))
		}
	}
	return o, nil
}

// checkListen accepts HOST:PORT or :PORT with a port from 0 to 65535 (0: any free port).
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want HOST:PORT or :PORT, e.g. :5000 or 127.0.0.1:5000")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	return nil
}

// SplitList accepts repeated values and comma-separated lists alike (the environment and YAML
// settings give the latter): every element trimmed, empty ones dropped.
func SplitList(in []string) []string {
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
