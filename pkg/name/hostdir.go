package name

import "strings"

// HostDir returns the directory name containerd looks up under a config_path directory for a
// registry host (core/remotes/docker/config, hostDirectory): "host_port_" when the host has a
// port ("registry.local:5000" → "registry.local_5000_", "[::1]:5000" → "[::1]_5000_"), else the
// host itself. It splits at the last ':' exactly as containerd does, so the name is the one
// containerd reads even where that looks odd.
func HostDir(host string) string {
	if i := strings.LastIndex(host, ":"); i > 0 {
		return host[:i] + "_" + host[i+1:] + "_"
	}
	return host
}

// HostDirs returns the directory names containerd tries for a registry host under a config_path
// directory, in its order, before "_default" (core/remotes/docker/config, hostPaths):
// "host_port_" then "host:port" for a host with a port, the host alone otherwise.
func HostDirs(host string) []string {
	if d := HostDir(host); d != host {
		return []string{d, host}
	}
	return []string{host}
}

// HostFromDir reverses HostDir: "registry.local_5000_" → "registry.local:5000". A name not in
// the "host_port_" form with a decimal port is a host as it is ("ghcr.io", "_default", and the
// "host:port" form containerd also reads).
func HostFromDir(dir string) string {
	body, ok := strings.CutSuffix(dir, "_")
	if !ok {
		return dir
	}
	i := strings.LastIndex(body, "_")
	if i <= 0 || !decimal(body[i+1:]) {
		return dir
	}
	return body[:i] + ":" + body[i+1:]
}

func decimal(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
