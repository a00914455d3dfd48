package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
)

// TestGenUpstreamURL: gen writes an --upstream URL naming the registry itself as the fallback
// (an http-only registry keeps http) and refuses one naming another host, for every runtime
// (issue 11).
func TestGenUpstreamURL(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bootstraptest.WriteHostFile(t, root, "/etc/containerd/config.toml", []byte("version = 3\n"))
	code, stdout, stderr := runApp(t, "gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "2.4.2",
		"--upstream", "registry.lan:5000=http://registry.lan:5000", "--upstream", "docker.io", "--log-level", "error")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	got := string(bootstraptest.ReadHostFile(t, root, "/etc/containerd/certs.d/registry.lan_5000_/hosts.toml"))
	if !strings.Contains(got, "server = 'http://registry.lan:5000'") {
		t.Fatalf("hosts.toml:\n%s\nwant server = http://registry.lan:5000", got)
	}
	if got := string(bootstraptest.ReadHostFile(t, root, "/etc/containerd/certs.d/docker.io/hosts.toml")); !strings.Contains(got, "server = 'https://registry-1.docker.io'") {
		t.Fatalf("docker.io hosts.toml:\n%s", got)
	}

	for _, args := range [][]string{
		{"gen", "containerd", "--host-root", t.TempDir(), "--containerd-version", "2.4.2"},
		{"gen", "crio", "--host-root", t.TempDir(), "--crio-version", "1.31.0"},
		{"gen", "talos"},
	} {
		code, _, stderr := runApp(t, append(args, "--mirror", "http://10.0.0.5:5000", "--upstream", "docker.io=https://mirror.gcr.io")...)
		if code != exitUsage || !strings.Contains(stderr, "docker.io=https://mirror.gcr.io") {
			t.Fatalf("%s: exit %d, stderr %q; want 2 naming the value", args[1], code, stderr)
		}
		code, _, stderr = runApp(t, append(args, "--mirror", "http://10.0.0.5:5000", "--upstream", "ghcr.io=https://cache.example:5000")...)
		if code != exitUsage || !strings.Contains(stderr, "names another host") {
			t.Fatalf("%s: exit %d, stderr %q; want 2", args[1], code, stderr)
		}
		if len(args) > 3 {
			if ents, _ := filepath.Glob(filepath.Join(args[3], "*")); len(ents) != 0 {
				t.Fatalf("%s: refused runs wrote %v", args[1], ents)
			}
		}
	}
}

// TestGenTalosRemoveMachineConfig: --machine-config is for --remove and needs --mirror; with it
// the removal names the node's nodecache mirrors, not the --upstream list.
func TestGenTalosRemoveMachineConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	node := filepath.Join(dir, "node.yaml")
	cfg := "version: v1alpha1\nmachine:\n  type: worker\n  registries:\n    mirrors:\n      ghcr.io:\n        endpoints: [http://10.0.0.5:5000]\n      registry.site.lan:\n        endpoints: [https://mirror.site.lan]\ncluster:\n  controlPlane:\n    endpoint: https://10.5.0.2:6443\n"
	bootstraptest.WriteHostFile(t, dir, "/node.yaml", []byte(cfg))
	code, _, stderr := runApp(t, "gen", "talos", "--mirror", "http://10.0.0.5:5000", "--machine-config", node)
	if code != exitUsage || !strings.Contains(stderr, "--machine-config is for --remove") {
		t.Fatalf("without --remove: exit %d %q", code, stderr)
	}
	code, _, stderr = runApp(t, "gen", "talos", "--remove", "--machine-config", node)
	if code != exitUsage || !strings.Contains(stderr, "needs --mirror") {
		t.Fatalf("without --mirror: exit %d %q", code, stderr)
	}
	code, stdout, stderr := runApp(t, "gen", "talos", "--remove", "--mirror", "http://10.0.0.5:5000", "--machine-config", node, "--upstream", "docker.io")
	if code != 0 || !strings.Contains(stdout, "ghcr.io:\n") || strings.Contains(stdout, "docker.io") || strings.Contains(stdout, "registry.site.lan") {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
}
