package warm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
)

// genMachineConfig generates a machine config with machinery (Talos contract of version,
// Kubernetes k8s, installer image), applies patches, and returns it in the form talosctl prints:
// "config" (talosctl read /system/state/config.yaml) or "resource" (talosctl get machineconfig
// -o yaml).
func genMachineConfig(t *testing.T, typ machine.Type, version, k8s, installer, form string, patches ...string) string {
	t.Helper()
	contract, err := talosconfig.ParseContractFromVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	in, err := generate.NewInput("warm-test", "https://10.5.0.2:6443", k8s,
		generate.WithVersionContract(contract), generate.WithInstallDisk("/dev/sda"), generate.WithInstallImage(installer))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := in.Config(typ)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		t.Fatal(err)
	}
	if len(patches) > 0 {
		var ps []configpatcher.Patch
		for _, p := range patches {
			patch, err := configpatcher.LoadPatch([]byte(p))
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, patch)
		}
		out, err := configpatcher.Apply(configpatcher.WithBytes(b), ps)
		if err != nil {
			t.Fatal(err)
		}
		if b, err = out.Bytes(); err != nil {
			t.Fatal(err)
		}
	}
	if form == "resource" {
		var r strings.Builder
		r.WriteString("node: 10.5.0.3\nmetadata:\n    namespace: config\n    type: MachineConfigs.config.talos.dev\n    id: v1alpha1\n    version: 2\n    phase: running\nspec: |\n")
		for _, l := range strings.SplitAfter(string(b), "\n") {
			if l != "" {
				r.WriteString("    " + l)
			}
		}
		b = []byte(r.String())
	}
	p := filepath.Join(t.TempDir(), "machineconfig.yaml")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMachineConfigImages: machine configs produced by machinery, in both input forms, give the
// images the node pulls: what the config names, plus the pause and flannel of the release its
// installer image names.
func TestMachineConfigImages(t *testing.T) {
	t.Parallel()
	const installer = "ghcr.io/siderolabs/installer:v1.13.8"
	worker := []string{
		"ghcr.io/siderolabs/kubelet:v1.35.2", "registry.k8s.io/kube-proxy:v1.35.2", "registry.k8s.io/coredns/coredns:",
		installer, "registry.k8s.io/pause:3.10.1", "ghcr.io/siderolabs/flannel:v0.28.8",
	}
	controlPlane := []string{
		"ghcr.io/siderolabs/kubelet:v1.35.2", "registry.k8s.io/kube-apiserver:v1.35.2", "registry.k8s.io/kube-controller-manager:v1.35.2",
		"registry.k8s.io/kube-scheduler:v1.35.2", "registry.k8s.io/etcd:", "registry.k8s.io/kube-proxy:v1.35.2", "registry.k8s.io/coredns/coredns:",
		installer, "registry.k8s.io/pause:3.10.1", "ghcr.io/siderolabs/flannel:v0.28.8",
	}
	tests := []struct {
		name      string
		typ       machine.Type
		installer string
		talos     string
		patches   []string
		want      []string // prefixes, in order
		note      string
	}{
		{name: "worker", typ: machine.TypeWorker, installer: installer, want: worker, note: "defaults of Talos v1.13.8, from the tag of machine.install.image"},
		{name: "control plane", typ: machine.TypeControlPlane, installer: installer, want: controlPlane},
		{name: "no proxy, no coredns, another CNI", typ: machine.TypeWorker, installer: installer,
			patches: []string{"cluster:\n  proxy:\n    disabled: true\n  coreDNS:\n    disabled: true\n  network:\n    cni:\n      name: none\n"},
			want:    []string{"ghcr.io/siderolabs/kubelet:v1.35.2", installer, "registry.k8s.io/pause:3.10.1"}},
		{name: "release from --talos-version", typ: machine.TypeWorker, installer: "factory.example/installer/abc:custom", talos: "v1.12.4",
			want: []string{"ghcr.io/siderolabs/kubelet:v1.35.2", "registry.k8s.io/kube-proxy:v1.35.2", "registry.k8s.io/coredns/coredns:", "factory.example/installer/abc:custom", "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"},
			note: "defaults of Talos v1.12.4, from --talos-version"},
	}
	for _, tc := range tests {
		for _, form := range []string{"config", "resource"} {
			t.Run(tc.name+"/"+form, func(t *testing.T) {
				t.Parallel()
				path := genMachineConfig(t, tc.typ, "v1.13.0", "1.35.2", tc.installer, form, tc.patches...)
				c := baseConfig()
				c.MachineConfig, c.TalosVersion = path, tc.talos
				opts, err := c.Options(nil)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, s := range opts.Sources {
					got = append(got, s.Reference)
					if !strings.HasPrefix(s.From[0], "--machine-config "+path) {
						t.Errorf("%s named by %v", s.Reference, s.From)
					}
				}
				ok := len(got) == len(tc.want)
				for i := 0; ok && i < len(got); i++ {
					ok = strings.HasPrefix(got[i], tc.want[i])
				}
				if !ok {
					t.Fatalf("images\n  %s\nwant (prefixes)\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
				}
				if !slices.ContainsFunc(opts.Notes, func(n string) bool { return strings.Contains(n, tc.note) }) {
					t.Fatalf("notes %q lack %q", opts.Notes, tc.note)
				}
			})
		}
	}
}

func TestMachineConfigRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("hello: world\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "missing.yaml"), bad} {
		c := baseConfig()
		c.MachineConfig = p
		if _, err := c.Options(nil); err == nil || !strings.Contains(err.Error(), "--machine-config") {
			t.Errorf("%s: %v", p, err)
		}
	}
}
