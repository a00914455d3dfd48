package warm

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
)

// TestTalosReleaseTable: the generated row of the release this build links equals what the
// linked machinery says (the generator reads the constants the compiler reads, and joins the
// defaults as the v1alpha1 accessors do for an unset field), and the checked facts of older
// releases hold.
func TestTalosReleaseTable(t *testing.T) {
	t.Parallel()
	linkedRow := linkedRelease()
	if i := slices.IndexFunc(talosReleases, func(r talosRelease) bool { return r.Version == linkedRow.Version }); i < 0 || talosReleases[i] != linkedRow {
		t.Fatalf("linked machinery %+v\nhas no equal row in the table %+v", linkedRow, talosReleases)
	}
	unset := &v1alpha1.Config{}
	for _, tc := range []struct{ role, accessor, row string }{
		{"kubelet", (&v1alpha1.KubeletConfig{}).Image(), linkedRow.KubeletImage + ":" + linkedRow.Kubernetes},
		{"kube-proxy", (&v1alpha1.ProxyConfig{}).Image(), linkedRow.KubeProxyImage + ":" + linkedRow.Kubernetes},
		{"kube-apiserver", (&v1alpha1.APIServerConfig{}).Image(), linkedRow.APIServerImage + ":" + linkedRow.Kubernetes},
		{"kube-controller-manager", (&v1alpha1.ControllerManagerConfig{}).Image(), linkedRow.ControllerManagerImage + ":" + linkedRow.Kubernetes},
		{"kube-scheduler", (&v1alpha1.SchedulerConfig{}).Image(), linkedRow.SchedulerImage + ":" + linkedRow.Kubernetes},
		{"etcd", (&v1alpha1.EtcdConfig{}).Image(), linkedRow.Etcd},
		{"coredns", unset.Cluster().CoreDNS().Image(), linkedRow.CoreDNS},
	} {
		if tc.accessor != tc.row {
			t.Errorf("%s: machinery's default for an unset field %q, the table's %q", tc.role, tc.accessor, tc.row)
		}
	}
	linked, err := TalosJoinImages("")
	if err != nil {
		t.Fatal(err)
	}
	fromTable, err := TalosJoinImagesFor(linked.TalosVersion, "")
	if err != nil {
		t.Fatalf("the linked machinery's release %s is not in the table: %v", linked.TalosVersion, err)
	}
	if !slices.Equal(fromTable.Images, linked.Images) || fromTable.KubernetesVersion != linked.KubernetesVersion || fromTable.Note != "" {
		t.Fatalf("table %s: %+v\nmachinery: %+v", linked.TalosVersion, fromTable, linked)
	}
	for _, tc := range []struct {
		talos, k8s, flannel, pause, coreDNS, etcd string
	}{
		{"v1.10.6", "v1.33.3", "v0.26.7", "registry.k8s.io/pause:3.10", "registry.k8s.io/coredns/coredns:v1.12.1", "gcr.io/etcd-development/etcd:v3.5.21"},
		{"v1.11.5", "v1.34.1", "v0.27.4", "registry.k8s.io/pause:3.10", "registry.k8s.io/coredns/coredns:v1.12.4", "gcr.io/etcd-development/etcd:v3.6.5"},
		{"1.12.4", "v1.35.0", "v0.27.4", "registry.k8s.io/pause:3.10", "registry.k8s.io/coredns/coredns:v1.13.2", "registry.k8s.io/etcd:v3.6.7"},
		{"v1.13.8", "v1.36.2", "v0.28.8", "registry.k8s.io/pause:3.10.1", "registry.k8s.io/coredns/coredns:v1.14.6", "registry.k8s.io/etcd:v3.6.12"},
	} {
		set, err := TalosJoinImagesFor(tc.talos, "")
		if err != nil {
			t.Fatalf("%s: %v", tc.talos, err)
		}
		if rel, _, err := talosReleaseFor(tc.talos); err != nil || rel.CoreDNS != tc.coreDNS || rel.Etcd != tc.etcd || rel.Kubernetes != tc.k8s {
			t.Errorf("%s: row %+v (%v), want CoreDNS %s, etcd %s, Kubernetes %s", tc.talos, rel, err, tc.coreDNS, tc.etcd, tc.k8s)
		}
		want := []string{"ghcr.io/siderolabs/kubelet:" + tc.k8s, "registry.k8s.io/kube-proxy:" + tc.k8s, tc.pause, "ghcr.io/siderolabs/flannel:" + tc.flannel}
		if !slices.Equal(set.Images, want) || set.KubernetesVersion != tc.k8s || set.Note != "" {
			t.Errorf("%s: %v (k8s %s), want %v", tc.talos, set.Images, set.KubernetesVersion, want)
		}
	}
}

func TestTalosJoinImagesFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, talos, k8s string
		wantVersion      string
		wantFirst        string
		wantNote         string
		wantErr          string
	}{
		{name: "another patch of a known minor", talos: "v1.12.9", wantVersion: "v1.12.4", wantFirst: "ghcr.io/siderolabs/kubelet:v1.35.0", wantNote: "Talos v1.12.9 is not in this build's table; using the images of v1.12.4"},
		{name: "kubernetes override", talos: "v1.11.5", k8s: "1.34.3", wantVersion: "v1.11.5", wantFirst: "ghcr.io/siderolabs/kubelet:v1.34.3"},
		{name: "unknown minor", talos: "v1.9.6", wantErr: `--talos-version "v1.9.6" refused: not a Talos release this build knows; known: v1.10.6, v1.11.5, v1.12.4, v1.13.8`},
		{name: "malformed", talos: "v1.12", wantErr: "want vMAJOR.MINOR.PATCH"},
		{name: "newline", talos: "v1.12.4\nid", wantErr: `--talos-version "v1.12.4\nid" refused`},
		{name: "bad kubernetes", talos: "v1.12.4", k8s: "latest", wantErr: "--kubernetes-version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			set, err := TalosJoinImagesFor(tc.talos, tc.k8s)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want a refusal containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if set.TalosVersion != tc.wantVersion || set.Images[0] != tc.wantFirst || !strings.Contains(set.Note, tc.wantNote) {
				t.Fatalf("set %+v", set)
			}
		})
	}
}
