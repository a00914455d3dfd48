package peer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/internal/inputfile"
)

// Source is where the member addresses come from (--peers).
type Source interface {
	// Addresses returns the current peer-port addresses (host:port), deduplicated, sorted.
	Addresses(ctx context.Context) ([]string, error)
	// String is the source as --peers names it.
	String() string
}

// Resolver looks up the A and AAAA records of a name; *net.Resolver implements it. Tests pass a
// fake, since no DNS server runs in them.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
}

// SourceOptions configure ParseSourceOptions.
type SourceOptions struct {
	// Resolver answers dns: sources. Default net.DefaultResolver.
	Resolver Resolver
	// Logger receives a file: source's re-read failures (once until it reads again) and
	// changes. Default: disabled.
	Logger zerolog.Logger
}

// sourceAccepted is what --peers accepts, for the errors of ParseSource.
const sourceAccepted = `want "dns:NAME:PORT", "file:PATH" or "HOST:PORT,HOST:PORT,..."`

// ParseSource parses --peers with the default options (the system resolver, no logging); see
// ParseSourceOptions.
func ParseSource(s string) (Source, error) {
	return ParseSourceOptions(s, SourceOptions{})
}

// ParseSourceOptions parses --peers:
//
//   - "dns:NAME:PORT": the A and AAAA records of NAME (a headless Service, say), each with PORT;
//     resolved again on every Addresses call. A name that does not exist (NXDOMAIN, which is what
//     a headless Service with no ready endpoint answers) is an empty list, not an error.
//   - "file:PATH": one HOST:PORT a line, blank lines and # comments ignored; read again
//     when the file changed (identity, size or mtime: internal/filestamp), and the last good list
//     kept (and the failure logged once) when it becomes unreadable or invalid. The file is not
//     read here: the first Addresses call reads it.
//   - "HOST:PORT,HOST:PORT,...": a static list.
//
// A HOST:PORT has a non-empty host (an IPv6 address in brackets) and a port from 1 to 65535.
//
// Errors (all naming s and what is accepted): an unknown scheme, a missing or bad port, an empty
// host, name, path or list.
func ParseSourceOptions(s string, opts SourceOptions) (Source, error) {
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	s = strings.TrimSpace(s)
	scheme, rest, hasScheme := strings.Cut(s, ":")
	switch {
	case s == "":
		return nil, fmt.Errorf("--peers is empty; %s", sourceAccepted)
	case hasScheme && scheme == "dns":
		return parseDNS(s, rest, opts.Resolver)
	case hasScheme && scheme == "file":
		if rest == "" {
			return nil, fmt.Errorf("--peers %q: no path after file:; %s", s, sourceAccepted)
		}
		return &fileSource{path: rest, log: opts.Logger}, nil
	case hasScheme && isScheme(scheme) && !strings.Contains(s, ",") &&
		(strings.HasPrefix(rest, "//") || strings.Contains(rest, ":")) && !unbracketedIPv6(s):
		// "https://a:1" or "srv:name:1": a scheme this does not know. "peer-0:5001" and
		// "peer-0:http" are HOST:PORT (the second with a bad port), "fd00::1:5001" an IPv6
		// address without its brackets.
		return nil, fmt.Errorf("--peers %q: unknown scheme %q; %s", s, scheme, sourceAccepted)
	}
	return parseStatic(s)
}

// unbracketedIPv6 reports whether s is an IPv6 address, or one followed by ":PORT".
func unbracketedIPv6(s string) bool {
	return net.ParseIP(s) != nil || net.ParseIP(s[:strings.LastIndex(s, ":")]) != nil
}

// isScheme reports whether s looks like a URI scheme (RFC 3986 section 3.1: a letter, then
// letters, digits, "+", "-" or ".").
func isScheme(s string) bool {
	for i, r := range s {
		letter := (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !letter && (i == 0 || !strings.ContainsRune("0123456789+-.", r)) {
			return false
		}
	}
	return s != ""
}

// parseStatic parses the static list s.
func parseStatic(s string) (Source, error) {
	var addrs []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		a, err := parseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("--peers %q: %w; %s", s, err, sourceAccepted)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("--peers %q: the list is empty; %s", s, sourceAccepted)
	}
	return staticSource{spec: s, addrs: normalize(addrs)}, nil
}

// parseDNS parses "dns:NAME:PORT" (s in full, rest after "dns:").
func parseDNS(s, rest string, r Resolver) (Source, error) {
	i := strings.LastIndex(rest, ":")
	if i < 0 {
		return nil, fmt.Errorf("--peers %q: no port after the name; %s", s, sourceAccepted)
	}
	name, port := rest[:i], rest[i+1:]
	if name == "" {
		return nil, fmt.Errorf("--peers %q: no name before the port; %s", s, sourceAccepted)
	}
	if strings.ContainsAny(name, ":[]/ ") {
		return nil, fmt.Errorf("--peers %q: %q is not a DNS name; %s", s, name, sourceAccepted)
	}
	if err := checkPort(port); err != nil {
		return nil, fmt.Errorf("--peers %q: %w; %s", s, err, sourceAccepted)
	}
	return &dnsSource{spec: s, name: name, port: port, resolver: r}, nil
}

// parseAddr checks one HOST:PORT and returns it as net.JoinHostPort writes it.
//
// Errors: no port, a bad port, an empty host, an IPv6 address without brackets.
func parseAddr(a string) (string, error) {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) && ae.Err == "missing port in address" {
			return "", fmt.Errorf("%q has no port", a)
		}
		return "", fmt.Errorf("%q is not HOST:PORT (an IPv6 address goes in brackets: [::1]:5001)", a)
	}
	if host == "" {
		return "", fmt.Errorf("%q has no host", a)
	}
	if err := checkPort(port); err != nil {
		return "", fmt.Errorf("%q: %w", a, err)
	}
	return net.JoinHostPort(host, port), nil
}

// checkPort refuses a port that is not a number from 1 to 65535.
func checkPort(port string) error {
	if port == "" {
		return errors.New("no port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strings.HasPrefix(port, "+") {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// normalize sorts and deduplicates addrs in place.
func normalize(addrs []string) []string {
	slices.Sort(addrs)
	return slices.Compact(addrs)
}

// staticSource is a --peers list given on the command line.
type staticSource struct {
	spec  string
	addrs []string
}

func (s staticSource) Addresses(context.Context) ([]string, error) {
	return slices.Clone(s.addrs), nil
}

func (s staticSource) String() string { return s.spec }

// dnsSource is "dns:NAME:PORT".
type dnsSource struct {
	spec, name, port string
	resolver         Resolver
}

// Addresses resolves the name again.
//
// Errors: the resolver's (a timeout, SERVFAIL), wrapped with the name; NXDOMAIN is no error.
func (s *dnsSource) Addresses(ctx context.Context) ([]string, error) {
	ips, err := s.resolver.LookupIPAddr(ctx, s.name)
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound {
		return []string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("resolve peers %s: %w", s.name, err)
	}
	addrs := make([]string, 0, len(ips))
	for _, ip := range ips {
		addrs = append(addrs, net.JoinHostPort(ip.String(), s.port))
	}
	return normalize(addrs), nil
}

func (s *dnsSource) String() string { return s.spec }

// fileSource is "file:PATH".
type fileSource struct {
	path string
	log  zerolog.Logger

	mu      sync.Mutex
	stamp   filestamp.Stamp
	addrs   []string // the last good list; nil before the first good read
	failing bool     // the last read failed (logged once until a read works)
}

// Addresses reads the file when it changed since the last good read.
//
// Errors: the file has never been read successfully (the read's error: missing, not a regular
// file, larger than 1 MiB, a line that is not HOST:PORT). Later failures return the last good
// list.
func (s *fileSource) Addresses(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := filestamp.Of(s.path)
	if err == nil && st == s.stamp && s.addrs != nil {
		return slices.Clone(s.addrs), nil
	}
	addrs, err := readPeerFile(s.path)
	if err != nil {
		if s.addrs == nil {
			return nil, err
		}
		if !s.failing {
			s.log.Error().Str("file", s.path).Err(err).Msg("cannot re-read the peer list; keeping the list read before")
		}
		s.failing = true
		return slices.Clone(s.addrs), nil
	}
	if s.failing || (s.addrs != nil && !slices.Equal(addrs, s.addrs)) {
		s.log.Info().Str("file", s.path).Int("addresses", len(addrs)).Msg("peer list read again")
	}
	// The stamp taken before the read: a change during the read is read at the next call.
	s.stamp, s.addrs, s.failing = st, addrs, false
	return slices.Clone(addrs), nil
}

func (s *fileSource) String() string { return "file:" + s.path }

// readPeerFile reads and parses a peer list file.
//
// Errors: the read's (wrapped), or the first line that is not HOST:PORT (by number).
func readPeerFile(path string) ([]string, error) {
	b, err := inputfile.Read(path, inputfile.PeerList)
	if err != nil {
		return nil, fmt.Errorf("read peer list: %w", err)
	}
	addrs := []string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, len(b)+1)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#") // a comment, on its own line or after the address
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		a, err := parseAddr(line)
		if err != nil {
			return nil, fmt.Errorf("peer list %s, line %d: %w; want one HOST:PORT a line", path, n, err)
		}
		addrs = append(addrs, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read peer list %s: %w", path, err)
	}
	return normalize(addrs), nil
}
