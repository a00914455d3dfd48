package activation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// hostsVerdict is what containerd's own hosts.toml parser says about one upstream.
type hostsVerdict struct {
	Upstream string
	OK       bool
	// Undecided: the first host is neither the upstream itself nor known to be the mirror, and
	// nothing tells which host the mirror is (no Options.Mirror, no file nodecache wrote).
	Undecided bool
	Reason    string
	// First is the first host containerd would try, as scheme://host[path]; on Talos with its
	// image cache on, the first after it (hostsLead).
	First string
}

// talosImageCache is the endpoint of Talos's on-node image cache, registryd: plain http on
// 127.0.0.1:3172 (siderolabs/talos, pkg/machinery/constants: RegistrydListenAddress). When the
// image cache is ready, machined puts it first in the endpoints of every registry, whatever the
// machine config says, and adds a "*" entry (the directory _default) when there is none
// (internal/app/machined/pkg/controllers/cri/registries_config.go,
// RegistriesConfigController.Run), so the hosts.toml files Talos writes list it before the
// mirror nodecache's patch adds. registryd answers only the images of the node's image cache and
// an error status for any other (internal/app/machined/pkg/system/services/registry/registry.go),
// on which containerd goes on to the next host: the mirror after it is where the node's other
// pulls go. Only a Talos node gets this reading: elsewhere that address is whatever listens on
// it, and a host tried before the mirror is a bypass.
const talosImageCache = "http://127.0.0.1:3172"

// hostsLead drops from the front of the hosts containerd tries those the runtime puts before the
// mirror by design, and returns the rest and those dropped. The nil hostsLead drops none.
type hostsLead func(hosts []docker.RegistryHost) (rest, dropped []docker.RegistryHost)

// talosLead is a Talos node's hostsLead: the leading run of its image cache (talosImageCache,
// that scheme and host:port exactly), unless that is the mirror itself.
func talosLead(mirrors mirrorSet) hostsLead {
	return func(hosts []docker.RegistryHost) (rest, dropped []docker.RegistryHost) {
		i := 0
		for i < len(hosts) && strings.EqualFold(hosts[i].Scheme+"://"+hosts[i].Host, talosImageCache) && !mirrors.has(hosts[i]) {
			i++
		}
		return hosts[i:], hosts[:i]
	}
}

// apply is l(hosts), or hosts as they are for the nil hostsLead.
func (l hostsLead) apply(hosts []docker.RegistryHost) (rest, dropped []docker.RegistryHost) {
	if l == nil {
		return hosts, nil
	}
	return l(hosts)
}

// afterLead is the words that follow "first" in a reason when hosts were dropped before the
// first host judged: " after Talos's image cache http://127.0.0.1:3172/v2"; "" when none were.
func afterLead(dropped []docker.RegistryHost) string {
	if len(dropped) == 0 {
		return ""
	}
	return " after Talos's image cache " + hostURL(dropped[0])
}

// hostDirFunc resolves a registry host to its directory the way containerd does for a list of
// roots: the first root holding <host_port_>, <host:port> (or <host>) or _default wins. roots are host paths,
// resolved through the host view (an absolute link leads under the host root, as on the host);
// the directory returned is its local path, for containerd's parser to read.
func hostDirFunc(h *bootstrap.Host, roots []string) func(string) (string, error) {
	return func(host string) (string, error) {
		for _, r := range roots {
			for _, name := range append(name.HostDirs(host), "_default") {
				p := path.Join(r, name)
				st, err := h.Stat(p)
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					return "", fmt.Errorf("registry directory %s: %w", p, err)
				}
				if !st.IsDir() {
					continue
				}
				// containerd's parser reads hosts.toml whole, and a FIFO would block it.
				file := path.Join(p, "hosts.toml")
				if err := inputfile.CheckFS(h.FS(), bootstrap.FSName(file), file, inputfile.RuntimeConfig); inputfile.Refused(err) {
					return "", err
				}
				return h.Local(p)
			}
		}
		return "", errdefs.ErrNotFound
	}
}

// checkHosts asks containerd's parser (core/remotes/docker/config.ConfigureHosts) which host it
// tries first for each upstream, under the given roots (containerd's directory lookup). The
// first host, after those lead drops (Talos's image cache; nil: none), must be one of mirrors
// (scheme and host:port); with no mirror known, a first host other than the upstream's own
// endpoint is undecided.
func checkHosts(ctx context.Context, h *bootstrap.Host, roots []string, upstreams []string, mirrors mirrorSet, lead hostsLead) []hostsVerdict {
	dirOf := hostDirFunc(h, roots)
	hostRoot := h.Root()
	hosts := config.ConfigureHosts(ctx, config.HostOptions{HostDir: dirOf})
	var out []hostsVerdict
	for _, up := range upstreams {
		v := hostsVerdict{Upstream: up}
		dir, derr := dirOf(up)
		file := ""
		var syntax error
		if derr == nil {
			file = filepath.Join(dir, "hosts.toml")
			if b, err := inputfile.Read(file, inputfile.RuntimeConfig); err == nil {
				syntax = tomlSyntax(b)
			}
		}
		list, err := hosts(up)
		list, dropped := lead.apply(list)
		after := afterLead(dropped)
		switch {
		case inputfile.Refused(derr):
			v.Reason = fmt.Sprintf("%v: nodecache does not read it, and containerd cannot use it", derr)
		case err != nil:
			v.Reason = fmt.Sprintf("%s does not parse (%v): containerd falls back to the upstream", displayPath(hostRoot, file), err)
		case len(list) == 0:
			v.Reason = "containerd finds no host to pull from" + after
		default:
			first := list[0]
			v.First = hostURL(first)
			switch {
			case derr != nil:
				v.Reason = fmt.Sprintf("no hosts.toml for %s under %s: containerd pulls from %s directly", up, strings.Join(roots, ", "), v.First)
			case first.Capabilities&docker.HostCapabilityPull == 0:
				v.Reason = fmt.Sprintf("%s: first host%s %s lacks the pull capability", displayPath(hostRoot, file), after, v.First)
			case mirrors.has(first):
				v.OK = true
				v.Reason = fmt.Sprintf("%s: containerd tries %s first%s", displayPath(hostRoot, file), v.First, after)
				if len(dropped) > 0 {
					v.Reason += " (which answers only the images of the node's image cache)"
				}
				if first.Capabilities&docker.HostCapabilityResolve == 0 {
					v.Reason += " for blobs only (no resolve capability: tags are resolved upstream)"
				}
			case !mirrors.known() && !ownEndpoint(first, up):
				v.Undecided = true
				v.Reason = fmt.Sprintf("%s: containerd tries %s first%s; %s, so whether that is the mirror cannot be told", displayPath(hostRoot, file), v.First, after, noMirrorKnown)
			case syntax != nil:
				v.Reason = fmt.Sprintf("%s does not parse (%v): containerd ignores it and tries %s first, not the mirror %s", displayPath(hostRoot, file), syntax, v.First, mirrors)
			default:
				v.Reason = fmt.Sprintf("%s: first host%s is %s, not the mirror %s", displayPath(hostRoot, file), after, v.First, mirrors)
			}
		}
		out = append(out, v)
	}
	return out
}

// tomlSyntax is the TOML error of a hosts.toml, nil when it parses: containerd logs such a file
// and ignores it (the registry's own endpoint is used), so its parser returns no error to tell.
func tomlSyntax(data []byte) error {
	var doc map[string]any
	return toml.Unmarshal(data, &doc)
}

// noMirrorKnown says why a mirrorSet is empty.
const noMirrorKnown = "no --mirror was given and no hosts.toml was written by nodecache"

// ownEndpoint reports whether h is the upstream registry itself (its host, or docker.io's
// registry-1.docker.io): a first host that cannot be a mirror, whoever wrote the file.
func ownEndpoint(h docker.RegistryHost, upstream string) bool {
	own := strings.TrimPrefix(name.RegistryURL(upstream), "https://")
	return strings.EqualFold(h.Host, own) || strings.EqualFold(h.Host, upstream)
}

// mirrorSet tells which hosts are the mirror: the scheme://host:port of Options.Mirror, or,
// without it, the mirrors of the hosts.toml files nodecache wrote — the first host of its own
// files (mirrorapi.ManagedMarker) and the host gen added to a site's file it adopted
// (containerd.AdoptedMirror). Empty when neither tells.
type mirrorSet struct {
	hosts map[string]bool // lower-case scheme://host:port
	from  string          // where the set came from, for reasons ("" for --mirror)
}

func (m mirrorSet) known() bool { return len(m.hosts) > 0 }

func (m mirrorSet) has(h docker.RegistryHost) bool {
	return m.hosts[strings.ToLower(h.Scheme+"://"+h.Host)]
}

// String is the mirror for messages: "http://127.0.0.1:5000", with where it was learnt when not
// from --mirror.
func (m mirrorSet) String() string {
	if !m.known() {
		return "(unknown: " + noMirrorKnown + ")"
	}
	s := strings.Join(m.list(), ", ")
	if m.from != "" {
		s += " (" + m.from + ")"
	}
	return s
}

func (m mirrorSet) list() []string {
	out := make([]string, 0, len(m.hosts))
	for h := range m.hosts {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

func (m mirrorSet) addURL(raw string) {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" && u.Host != "" {
		m.hosts[strings.ToLower(u.Scheme+"://"+u.Host)] = true
	}
}

// hostsFile is one registry directory's hosts.toml under a config_path root, read on its own with
// containerd's parser for the registry its directory names.
type hostsFile struct {
	// Registry is the registry host the directory is for (containerd's host_port_ form converted
	// back).
	Registry string
	// Path is the hosts.toml's host path.
	Path string
	data []byte
	// Managed: nodecache wrote it (mirrorapi.ManagedMarker). Adopted: the mirror URL gen added to
	// this site file, "" when it did not.
	Managed bool
	Adopted string
	// Hosts are the hosts containerd tries for Registry with this directory, in order, but
	// those before the mirror by design (Lead: Talos's image cache, see hostsLead); Err is the
	// parser's error instead. Syntax is the file's TOML error (containerd then ignores it).
	Hosts  []docker.RegistryHost
	Lead   []docker.RegistryHost
	Err    error
	Syntax error
}

// ours reports whether nodecache wrote the file or added its mirror to it.
func (f hostsFile) ours() bool { return f.Managed || f.Adopted != "" }

// namesMirror reports whether containerd's parser finds one of mirrors among the file's hosts
// (anywhere: first or not, the verdict is checkHosts'), or, for a file it cannot parse, whether
// the file's text mentions one.
func (f hostsFile) namesMirror(mirrors mirrorSet) bool {
	for _, h := range f.Hosts {
		if mirrors.has(h) {
			return true
		}
	}
	if f.Err != nil || f.Syntax != nil {
		text := strings.ToLower(string(f.data))
		for h := range mirrors.hosts {
			if _, hostPort, ok := strings.Cut(h, "://"); ok && strings.Contains(text, hostPort) {
				return true
			}
		}
	}
	return false
}

// summary says what containerd does with the file: "<path> tries <first host> first".
func (f hostsFile) summary() string {
	switch {
	case f.Err != nil:
		return fmt.Sprintf("%s: containerd's parser fails (%v)", f.Path, f.Err)
	case len(f.Hosts) == 0:
		return fmt.Sprintf("%s names no host%s", f.Path, afterLead(f.Lead))
	case f.Syntax != nil:
		return fmt.Sprintf("%s does not parse (%v): containerd ignores it and tries %s first", f.Path, f.Syntax, hostURL(f.Hosts[0]))
	}
	return fmt.Sprintf("%s tries %s first%s", f.Path, hostURL(f.Hosts[0]), afterLead(f.Lead))
}

// scanHosts reads every registry directory's hosts.toml under the roots (_default skipped),
// each parsed on its own by containerd's ConfigureHosts, in root order then name order, the
// hosts lead drops set apart (nil: none). A hosts.toml that is no regular file of at most
// inputfile.RuntimeConfig.Limit bytes (a FIFO would block containerd's parser) is its refusal
// (inputfile.Refused).
func scanHosts(ctx context.Context, h *bootstrap.Host, roots []string, lead hostsLead) ([]hostsFile, error) {
	var out []hostsFile
	for _, r := range roots {
		entries, err := h.ReadDir(r)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list registry directories %s: %w", r, err)
		}
		for _, e := range entries {
			dir := path.Join(r, e.Name())
			if e.Name() == "_default" || !h.IsDir(dir) {
				continue
			}
			f := hostsFile{Registry: name.HostFromDir(e.Name()), Path: path.Join(dir, "hosts.toml")}
			if f.data, err = h.ReadFile(f.Path); err != nil {
				if inputfile.Refused(err) {
					return nil, err // a FIFO, device or oversized file: containerd cannot use it either
				}
				continue
			}
			f.Managed = mirrorapi.Managed(f.data)
			f.Syntax = tomlSyntax(f.data)
			if u, ok := bcontainerd.AdoptedMirror(f.data); ok {
				f.Adopted = u
			}
			local, err := h.Local(dir)
			if err != nil {
				f.Err = err
			} else {
				hosts := config.ConfigureHosts(ctx, config.HostOptions{HostDir: func(string) (string, error) { return local, nil }})
				f.Hosts, f.Err = hosts(f.Registry)
				f.Hosts, f.Lead = lead.apply(f.Hosts)
			}
			out = append(out, f)
		}
	}
	return out, nil
}

// mirrorsOf is the mirror set for judging files: mirror when given, else learnt from the files
// nodecache wrote.
func mirrorsOf(mirror *url.URL, files []hostsFile) mirrorSet {
	m := mirrorSet{hosts: map[string]bool{}}
	if mirror != nil {
		m.addURL(mirror.String())
		return m
	}
	m.from = "the mirror of nodecache's hosts.toml files"
	for _, f := range files {
		switch {
		case f.Adopted != "":
			m.addURL(f.Adopted)
		case f.Managed && len(f.Hosts) > 0 && !ownEndpoint(f.Hosts[0], f.Registry):
			m.addURL(hostURL(f.Hosts[0]))
		}
	}
	return m
}

// judgedRegistries picks the registries whose hosts.toml decides the verdict when no upstream
// list is given: every one with a file nodecache wrote or adopted, or a file that names the
// mirror as containerd's parser reads it (hand-written, or a site's) — who wrote it does not
// matter, what containerd does with it does. skipped are the other files, for an info row.
func judgedRegistries(files []hostsFile, mirrors mirrorSet) (judged []string, skipped []hostsFile) {
	seen := map[string]bool{}
	for _, f := range files {
		if !f.ours() && !f.namesMirror(mirrors) {
			skipped = append(skipped, f)
			continue
		}
		if !seen[f.Registry] {
			seen[f.Registry] = true
			judged = append(judged, f.Registry)
		}
	}
	sort.Strings(judged)
	// A registry judged through one of its directories is not "skipped" through another.
	kept := skipped[:0]
	for _, f := range skipped {
		if !seen[f.Registry] {
			kept = append(kept, f)
		}
	}
	return judged, kept
}

func hostURL(h docker.RegistryHost) string {
	u := url.URL{Scheme: h.Scheme, Host: h.Host, Path: h.Path}
	return u.String()
}

func displayPath(hostRoot, p string) string {
	if p == "" {
		return "hosts.toml"
	}
	if rel, err := filepath.Rel(hostRoot, p); err == nil && !strings.HasPrefix(rel, "..") {
		return filepath.Join("/", rel)
	}
	return p
}
