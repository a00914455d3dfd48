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
func genMachineConfig(t testing.TB, typ machine.Type, version, k8s, installer, form string, patches ...string) string {
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
// images the node pulls: what the config names (always winning, even when it equals this build's
// default), and for what it leaves unset the defaults of the release its installer image (or
// --talos-version) names — kubelet, kube-proxy (a worker's at the kubelet's Kubernetes version),
// CoreDNS, control-plane components and etcd, pause and flannel — never this build's.
func TestMachineConfigImages(t *testing.T) {
	t.Parallel()
	const installer = "ghcr.io/siderolabs/installer:v1.13.8"
	worker := []string{
		"ghcr.io/siderolabs/kubelet:v1.35.2", "registry.k8s.io/kube-proxy:v1.35.2", "registry.k8s.io/coredns/coredns:v1.14.6",
		installer, "registry.k8s.io/pause:3.10.1", "ghcr.io/siderolabs/flannel:v0.28.8",
	}
	controlPlane := []string{
		"ghcr.io/siderolabs/kubelet:v1.35.2", "registry.k8s.io/kube-apiserver:v1.35.2", "registry.k8s.io/kube-controller-manager:v1.35.2",
		"registry.k8s.io/kube-scheduler:v1.35.2", "registry.k8s.io/etcd:v3.6.12", "registry.k8s.io/kube-proxy:v1.35.2", "registry.k8s.io/coredns/coredns:v1.14.6",
		installer, "registry.k8s.io/pause:3.10.1", "ghcr.io/siderolabs/flannel:v0.28.8",
	}
	// Patches leaving the images to defaults (machinery's generator names them).
	const (
		noKubelet      = `[{"op": "remove", "path": "/machine/kubelet/image"}]`
		noControlPlane = `[{"op": "remove", "path": "/machine/kubelet/image"}, {"op": "remove", "path": "/cluster/apiServer/image"},` +
			` {"op": "remove", "path": "/cluster/controllerManager/image"}, {"op": "remove", "path": "/cluster/scheduler/image"},` +
			` {"op": "remove", "path": "/cluster/proxy/image"}]`
		installer1115 = "ghcr.io/siderolabs/installer:v1.11.5"
		custom        = "factory.example/installer/abc:custom"
	)
	tests := []struct {
		name      string
		typ       machine.Type
		contract  string // Talos contract the config is generated for; default v1.13.0
		installer string
		talos     string
		patches   []string
		want      []string // exactly, in order
		from      []string // each image's source after "--machine-config PATH", when checked
		note      string
	}{
		{name: "worker", typ: machine.TypeWorker, installer: installer, want: worker, note: "defaults of Talos v1.13.8, from the tag of machine.install.image"},
		{name: "control plane", typ: machine.TypeControlPlane, installer: installer, want: controlPlane},
		{name: "no proxy, no coredns, another CNI", typ: machine.TypeWorker, installer: installer,
			patches: []string{"cluster:\n  proxy:\n    disabled: true\n  coreDNS:\n    disabled: true\n  network:\n    cni:\n      name: none\n"},
			want:    []string{"ghcr.io/siderolabs/kubelet:v1.35.2", installer, "registry.k8s.io/pause:3.10.1"}},
		{name: "release from --talos-version", typ: machine.TypeWorker, installer: custom, talos: "v1.12.4",
			want: []string{"ghcr.io/siderolabs/kubelet:v1.35.2", "registry.k8s.io/kube-proxy:v1.35.2", "registry.k8s.io/coredns/coredns:v1.13.2", custom, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"},
			note: "defaults of Talos v1.12.4, from --talos-version"},
		// newuser2 #3: installer v1.11.5, no kubelet image named: Talos v1.11.5's defaults.
		{name: "worker of v1.11.5 naming no kubelet", typ: machine.TypeWorker, contract: "v1.11.0", installer: installer1115, patches: []string{noKubelet},
			want: []string{"ghcr.io/siderolabs/kubelet:v1.34.1", "registry.k8s.io/kube-proxy:v1.34.1", "registry.k8s.io/coredns/coredns:v1.12.4", installer1115, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"},
			from: []string{": Talos v1.11.5 default (kubelet)", ": Talos v1.11.5 default (kube-proxy)", ": Talos v1.11.5 default (coredns)", " (machine.install.image)", ": Talos v1.11.5 default (pause)", ": Talos v1.11.5 default (flannel)"},
			note: "defaults of Talos v1.11.5, from the tag of machine.install.image"},
		{name: "control plane of v1.11.5 naming no image", typ: machine.TypeControlPlane, contract: "v1.11.0", installer: installer1115, patches: []string{noControlPlane},
			want: []string{"ghcr.io/siderolabs/kubelet:v1.34.1", "registry.k8s.io/kube-apiserver:v1.34.1", "registry.k8s.io/kube-controller-manager:v1.34.1",
				"registry.k8s.io/kube-scheduler:v1.34.1", "gcr.io/etcd-development/etcd:v3.6.5", "registry.k8s.io/kube-proxy:v1.34.1", "registry.k8s.io/coredns/coredns:v1.12.4",
				installer1115, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"},
			note: "defaults of Talos v1.11.5"},
		// newuser2 #3, explicit --talos-version v1.10.6.
		{name: "worker naming no kubelet with --talos-version v1.10.6", typ: machine.TypeWorker, contract: "v1.10.0", installer: custom, talos: "v1.10.6", patches: []string{noKubelet},
			want: []string{"ghcr.io/siderolabs/kubelet:v1.33.3", "registry.k8s.io/kube-proxy:v1.33.3", "registry.k8s.io/coredns/coredns:v1.12.1", custom, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.26.7"},
			note: "defaults of Talos v1.10.6, from --talos-version"},
		{name: "control plane naming no image with --talos-version v1.10.6", typ: machine.TypeControlPlane, contract: "v1.10.0", installer: custom, talos: "v1.10.6", patches: []string{noControlPlane},
			want: []string{"ghcr.io/siderolabs/kubelet:v1.33.3", "registry.k8s.io/kube-apiserver:v1.33.3", "registry.k8s.io/kube-controller-manager:v1.33.3",
				"registry.k8s.io/kube-scheduler:v1.33.3", "gcr.io/etcd-development/etcd:v3.5.21", "registry.k8s.io/kube-proxy:v1.33.3", "registry.k8s.io/coredns/coredns:v1.12.1",
				custom, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.26.7"}},
		// What the config names wins over the release's defaults, even this build's default
		// kubelet (v1.36.2, Talos v1.13.8's) on a v1.11.5 node; kube-proxy follows that kubelet.
		{name: "v1.11.5 worker naming its own kubelet and coredns", typ: machine.TypeWorker, contract: "v1.11.0", installer: installer1115,
			patches: []string{"machine:\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.36.2\ncluster:\n  coreDNS:\n    image: registry.example/coredns:v1.11.9\n"},
			want:    []string{"ghcr.io/siderolabs/kubelet:v1.36.2", "registry.k8s.io/kube-proxy:v1.36.2", "registry.example/coredns:v1.11.9", installer1115, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"},
			from:    []string{" (kubelet)", ": Talos v1.11.5 default (kube-proxy)", " (coredns)", " (machine.install.image)", ": Talos v1.11.5 default (pause)", ": Talos v1.11.5 default (flannel)"},
			note:    "defaults of Talos v1.11.5"},
		{name: "v1.11.5 control plane naming its own images", typ: machine.TypeControlPlane, contract: "v1.11.0", installer: installer1115,
			patches: []string{"cluster:\n  etcd:\n    image: registry.example/etcd:v3.5.9\n"},
			want: []string{"ghcr.io/siderolabs/kubelet:v1.35.2", "registry.k8s.io/kube-apiserver:v1.35.2", "registry.k8s.io/kube-controller-manager:v1.35.2",
				"registry.k8s.io/kube-scheduler:v1.35.2", "registry.example/etcd:v3.5.9", "registry.k8s.io/kube-proxy:v1.35.2", "registry.k8s.io/coredns/coredns:v1.12.4",
				installer1115, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"}},
	}
	for _, tc := range tests {
		for _, form := range []string{"config", "resource"} {
			t.Run(tc.name+"/"+form, func(t *testing.T) {
				t.Parallel()
				contract := tc.contract
				if contract == "" {
					contract = "v1.13.0"
				}
				path := genMachineConfig(t, tc.typ, contract, "1.35.2", tc.installer, form, tc.patches...)
				c := baseConfig()
				c.MachineConfig, c.TalosVersion = path, tc.talos
				opts, err := c.Options(nil)
				if err != nil {
					t.Fatal(err)
				}
				var got, from []string
				for _, s := range opts.Sources {
					got = append(got, s.Reference)
					f, ok := strings.CutPrefix(s.From[0], "--machine-config "+path)
					if !ok {
						t.Errorf("%s named by %v", s.Reference, s.From)
					}
					from = append(from, f)
				}
				if !slices.Equal(got, tc.want) {
					t.Fatalf("images\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
				}
				if tc.from != nil && !slices.Equal(from, tc.from) {
					t.Fatalf("sources\n  %s\nwant\n  %s", strings.Join(from, "\n  "), strings.Join(tc.from, "\n  "))
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
