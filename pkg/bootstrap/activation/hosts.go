package activation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/errdefs"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// hostsVerdict is what containerd's own hosts.toml parser says about one upstream.
type hostsVerdict struct {
	Upstream string
	OK       bool
	Reason   string
	// First is the first host containerd would try, as scheme://host[path].
	First string
	// Managed is true when the hosts.toml that decided starts with mirrorapi.ManagedMarker.
	Managed bool
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
				return h.Local(p)
			}
		}
		return "", errdefs.ErrNotFound
	}
}

// checkHosts asks containerd's parser (core/remotes/docker/config.ConfigureHosts) which host it
// tries first for each upstream, under the given roots. The mirror is the expected first host
// (scheme and host:port; nil accepts any first host other than the upstream's own endpoint when
// the deciding file is ours).
func checkHosts(ctx context.Context, h *bootstrap.Host, roots []string, upstreams []string, mirror *url.URL) []hostsVerdict {
	dirOf := hostDirFunc(h, roots)
	hostRoot := h.Root()
	hosts := config.ConfigureHosts(ctx, config.HostOptions{HostDir: dirOf})
	var out []hostsVerdict
	for _, up := range upstreams {
		v := hostsVerdict{Upstream: up}
		dir, derr := dirOf(up)
		file := ""
		if derr == nil {
			file = filepath.Join(dir, "hosts.toml")
			if b, err := os.ReadFile(file); err == nil {
				v.Managed = mirrorapi.Managed(b)
			}
		}
		list, err := hosts(up)
		switch {
		case err != nil:
			v.Reason = fmt.Sprintf("%s does not parse (%v): containerd falls back to the upstream", displayPath(hostRoot, file), err)
		case len(list) == 0:
			v.Reason = "containerd finds no host to pull from"
		default:
			first := list[0]
			v.First = hostURL(first)
			switch {
			case derr != nil:
				v.Reason = fmt.Sprintf("no hosts.toml for %s under %s: containerd pulls from %s directly", up, strings.Join(roots, ", "), v.First)
			case first.Capabilities&docker.HostCapabilityPull == 0:
				v.Reason = fmt.Sprintf("%s: first host %s lacks the pull capability", displayPath(hostRoot, file), v.First)
			case !isMirror(first, up, mirror, v.Managed):
				v.Reason = fmt.Sprintf("%s: first host is %s, not the mirror%s", displayPath(hostRoot, file), v.First, mirrorSuffix(mirror))
			default:
				v.OK = true
				v.Reason = fmt.Sprintf("%s: containerd tries %s first", displayPath(hostRoot, file), v.First)
				if first.Capabilities&docker.HostCapabilityResolve == 0 {
					v.Reason += " for blobs only (no resolve capability: tags are resolved upstream)"
				}
			}
		}
		out = append(out, v)
	}
	return out
}

func mirrorSuffix(mirror *url.URL) string {
	if mirror == nil {
		return ""
	}
	return " " + mirror.Scheme + "://" + mirror.Host
}

// isMirror reports whether h is the mirror: same scheme and host:port as mirror, or, with no
// mirror given, a host other than the upstream's own endpoint in a file nodecache wrote.
func isMirror(h docker.RegistryHost, upstream string, mirror *url.URL, managed bool) bool {
	if mirror != nil {
		return strings.EqualFold(h.Scheme, mirror.Scheme) && strings.EqualFold(h.Host, mirror.Host)
	}
	own := strings.TrimPrefix(name.RegistryURL(upstream), "https://")
	return managed && !strings.EqualFold(h.Host, own)
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

// registryDirs lists the registry hosts that have a hosts.toml under the roots (directory
// names converted back from containerd's host_port_ form; _default skipped). With onlyManaged,
// only hosts whose hosts.toml starts with mirrorapi.ManagedMarker.
func registryDirs(h *bootstrap.Host, roots []string, onlyManaged bool) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, r := range roots {
		entries, err := h.ReadDir(r)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list registry directories %s: %w", r, err)
		}
		for _, e := range entries {
			if e.Name() == "_default" || !h.IsDir(path.Join(r, e.Name())) {
				continue
			}
			b, err := h.ReadFile(path.Join(r, e.Name(), "hosts.toml"))
			if err != nil {
				continue
			}
			if onlyManaged && !mirrorapi.Managed(b) {
				continue
			}
			host := name.HostFromDir(e.Name())
			if !seen[host] {
				seen[host] = true
				out = append(out, host)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
