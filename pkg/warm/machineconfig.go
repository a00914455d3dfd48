package warm

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/constants"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
)

// machineConfigInputs reads a node's machine config (either form talos.ParseMachineConfig reads,
// the parser `gen talos --remove --machine-config` uses) and returns the images the node pulls:
// those the config names — kubelet; for a control plane kube-apiserver, kube-controller-manager,
// kube-scheduler and etcd; kube-proxy unless cluster.proxy.disabled; CoreDNS unless disabled;
// machine.install.image — and the Talos release's defaults for what no config holds: the pause
// image and, with the default CNI, flannel. The release is talosVersion when given, else the tag
// of machine.install.image when it is a release the table knows, else the one this build links;
// the note says which. kube-proxy, when the config does not name it (workers), follows the
// kubelet's Kubernetes version; other images the config leaves unset take machinery's defaults
// (this build's).
func machineConfigInputs(path, talosVersion string) ([]input, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", &RefusedError{What: "--machine-config", Value: path, Reason: fmt.Sprintf("cannot read it (%v); want the output of `talosctl read /system/state/config.yaml` or `talosctl get machineconfig -o yaml`", errors.Unwrap(err))}
	}
	cfg, err := talos.ParseMachineConfig(path, data)
	if err != nil {
		if errors.Is(err, bootstrap.ErrRefused) {
			return nil, "", &RefusedError{What: "--machine-config", Value: path, Reason: err.Error()}
		}
		return nil, "", fmt.Errorf("--machine-config %s: %w", path, err)
	}
	if cfg.Machine() == nil || cfg.Cluster() == nil {
		return nil, "", &RefusedError{What: "--machine-config", Value: path, Reason: "holds no v1alpha1 document (machine and cluster); want a node's whole machine config"}
	}
	var (
		out   []input
		notes []string
	)
	add := func(role, ref string) {
		if ref != "" {
			out = append(out, input{text: ref, from: "--machine-config " + path + " (" + role + ")"})
		}
	}
	m, c := cfg.Machine(), cfg.Cluster()
	add("kubelet", m.Kubelet().Image())
	if m.Type().IsControlPlane() {
		add("kube-apiserver", c.APIServer().Image())
		add("kube-controller-manager", c.ControllerManager().Image())
		add("kube-scheduler", c.Scheduler().Image())
		add("etcd", c.Etcd().Image())
	}
	if c.Proxy().Enabled() {
		add("kube-proxy", kubeProxyImage(cfg.RawV1Alpha1(), c.Proxy().Image(), m.Kubelet().Image()))
	}
	if c.CoreDNS().Enabled() {
		add("coredns", c.CoreDNS().Image())
	}
	install := m.Install().Image()
	add("machine.install.image", install)

	// The release whose defaults fill in what no machine config names.
	release, how := talosVersion, "--talos-version"
	if release == "" {
		nameTag, _, _ := strings.Cut(lastPathElement(install), "@")
		if _, tag, ok := strings.Cut(nameTag, ":"); ok {
			if _, err := TalosJoinImagesFor(tag, ""); err == nil {
				release, how = tag, "the tag of machine.install.image"
			}
		}
	}
	set, err := TalosJoinImagesFor(release, "")
	if err != nil {
		return nil, "", err
	}
	if release == "" {
		how = "this build's machinery (machine.install.image names no release the table knows)"
	}
	notes = append(notes, fmt.Sprintf("defaults of Talos %s, from %s", set.TalosVersion, how))
	if set.Note != "" {
		notes = append(notes, set.Note)
	}
	for i, role := range set.roles {
		switch {
		case role == "pause":
		case role == "flannel" && c.Network().CNI().Name() == constants.FlannelCNI:
		default:
			continue
		}
		out = append(out, input{text: set.Images[i], from: "--machine-config " + path + ": Talos " + set.TalosVersion + " default (" + role + ")"})
	}
	return out, strings.Join(notes, "; "), nil
}

// kubeProxyImage is the config's cluster.proxy.image; a config without one (a worker's, as
// machinery generates it) runs the kube-proxy of its cluster's Kubernetes version, which a node
// knows from its kubelet's tag — machinery's own default would be the linked release's version.
func kubeProxyImage(raw *v1alpha1.Config, configured, kubelet string) string {
	if raw != nil && raw.ClusterConfig != nil && raw.ClusterConfig.ProxyConfig != nil && raw.ClusterConfig.ProxyConfig.ContainerImage != "" {
		return configured
	}
	nameTag, _, _ := strings.Cut(lastPathElement(kubelet), "@")
	if _, tag, ok := strings.Cut(nameTag, ":"); ok && kubernetesVersionRe.MatchString(tag) {
		return constants.KubeProxyImage + ":" + tag
	}
	return configured
}

// lastPathElement is what follows the last "/" (the name:tag part of a reference).
func lastPathElement(ref string) string {
	if i := strings.LastIndex(ref, "/"); i >= 0 {
		return ref[i+1:]
	}
	return ref
}
