package warm

import (
	"errors"
	"fmt"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/constants"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// machineConfigInputs reads a node's machine config (either form talos.ParseMachineConfig reads,
// the parser `gen talos --remove --machine-config` uses) and returns the images the node pulls:
// kubelet; for a control plane kube-apiserver, kube-controller-manager, kube-scheduler and etcd;
// kube-proxy unless cluster.proxy.disabled; CoreDNS unless disabled; machine.install.image; the
// pause image and, with the default CNI, flannel.
//
// An image the config names wins. One it leaves unset is the default of the node's Talos release
// (the generated table, talos_releases_gen.go), never of the machinery this build links, whose
// accessors answer their own defaults for unset fields: so the raw v1alpha1 fields are read.
// The release is talosVersion when given, else the tag of machine.install.image when it is a
// release the table knows, else the one this build links; the note says which. kube-proxy,
// when the config does not name it (a worker's names none), follows the kubelet's Kubernetes
// version (the kubelet as named, or the release's default), since the control plane deploys
// the cluster's kube-proxy; the other unset images are the release's (Kubernetes components at
// its DefaultKubernetesVersion, its DefaultCoreDNSVersion and DefaultEtcdVersion).
func machineConfigInputs(path, talosVersion string) ([]input, string, error) {
	cfg, err := readMachineConfig(path)
	if err != nil {
		return nil, "", err
	}
	raw := cfg.RawV1Alpha1()
	if cfg.Machine() == nil || cfg.Cluster() == nil || raw == nil {
		return nil, "", refusal.Value("--machine-config", path, "holds no v1alpha1 document (machine and cluster); want a node's whole machine config")
	}
	m, c := cfg.Machine(), cfg.Cluster()
	install := m.Install().Image()
	rel, notes, err := nodeRelease(talosVersion, install)
	if err != nil {
		return nil, "", err
	}

	var out []input
	add := func(role, ref string, named bool) {
		if ref == "" {
			return
		}
		from := "--machine-config " + path + " (" + role + ")"
		if !named {
			from = "--machine-config " + path + ": Talos " + rel.Version + " default (" + role + ")"
		}
		out = append(out, input{text: ref, from: from})
	}
	orDefault := func(role, configured, def string) {
		if configured != "" {
			add(role, configured, true)
		} else {
			add(role, def, false)
		}
	}
	images := rawImages(raw)
	kubelet := images.kubelet
	if kubelet == "" {
		kubelet = rel.KubeletImage + ":" + rel.Kubernetes
	}
	add("kubelet", kubelet, images.kubelet != "")
	if m.Type().IsControlPlane() {
		orDefault("kube-apiserver", images.apiServer, rel.APIServerImage+":"+rel.Kubernetes)
		orDefault("kube-controller-manager", images.controllerManager, rel.ControllerManagerImage+":"+rel.Kubernetes)
		orDefault("kube-scheduler", images.scheduler, rel.SchedulerImage+":"+rel.Kubernetes)
		orDefault("etcd", images.etcd, rel.Etcd)
	}
	if c.Proxy().Enabled() {
		orDefault("kube-proxy", images.proxy, rel.KubeProxyImage+":"+kubernetesOf(kubelet, rel.Kubernetes))
	}
	if c.CoreDNS().Enabled() {
		orDefault("coredns", images.coreDNS, rel.CoreDNS)
	}
	add("machine.install.image", install, true)
	add("pause", rel.Pause, false)
	if c.Network().CNI().Name() == constants.FlannelCNI {
		add("flannel", talosFlannelRepository+":"+rel.Flannel, false)
	}
	return out, notes, nil
}

// readMachineConfig reads and parses the machine config at path (--machine-config).
func readMachineConfig(path string) (config.Provider, error) {
	data, err := inputfile.Read(path, inputfile.MachineConfig)
	if inputfile.Refused(err) {
		return nil, refusal.Value("--machine-config", path, err.Error())
	}
	if err != nil {
		return nil, refusal.Value("--machine-config", path, fmt.Sprintf("cannot read it (%v); want the output of `talosctl read /system/state/config.yaml` or `talosctl get machineconfig -o yaml`", errors.Unwrap(err)))
	}
	cfg, err := talos.ParseMachineConfig(path, data)
	if err != nil {
		if errors.Is(err, refusal.ErrRefused) {
			return nil, refusal.Value("--machine-config", path, err.Error())
		}
		return nil, fmt.Errorf("--machine-config %s: %w", path, err)
	}
	return cfg, nil
}

// nodeRelease is the release whose defaults fill in what the machine config leaves unset:
// talosVersion when given, else the tag of the install image when the table knows it, else this
// build's. notes says which, and why.
func nodeRelease(talosVersion, install string) (talosRelease, string, error) {
	release, how := talosVersion, "--talos-version"
	if release == "" {
		nameTag, _, _ := strings.Cut(lastPathElement(install), "@")
		if _, tag, ok := strings.Cut(nameTag, ":"); ok {
			if _, _, err := talosReleaseFor(tag); err == nil {
				release, how = tag, "the tag of machine.install.image"
			}
		}
	}
	rel, relNote, err := talosReleaseFor(release)
	if err != nil {
		return talosRelease{}, "", err
	}
	if release == "" {
		how = "this build's machinery (machine.install.image names no release the table knows)"
	}
	notes := []string{fmt.Sprintf("defaults of Talos %s, from %s", rel.Version, how)}
	if relNote != "" {
		notes = append(notes, relNote)
	}
	return rel, strings.Join(notes, "; "), nil
}

// configImages are the images a v1alpha1 machine config really names; "" where it leaves the
// field unset.
type configImages struct {
	kubelet, apiServer, controllerManager, scheduler, etcd, proxy, coreDNS string
}

// rawImages reads the image fields of raw as written, not through machinery's accessors, which
// answer the linked release's default for an unset field.
func rawImages(raw *v1alpha1.Config) configImages {
	var im configImages
	if mc := raw.MachineConfig; mc != nil && mc.MachineKubelet != nil {
		im.kubelet = mc.MachineKubelet.KubeletImage
	}
	cc := raw.ClusterConfig
	if cc == nil {
		return im
	}
	if cc.APIServerConfig != nil {
		im.apiServer = cc.APIServerConfig.ContainerImage
	}
	if cc.ControllerManagerConfig != nil {
		im.controllerManager = cc.ControllerManagerConfig.ContainerImage
	}
	if cc.SchedulerConfig != nil {
		im.scheduler = cc.SchedulerConfig.ContainerImage
	}
	if cc.EtcdConfig != nil {
		im.etcd = cc.EtcdConfig.ContainerImage
	}
	if cc.ProxyConfig != nil {
		im.proxy = cc.ProxyConfig.ContainerImage
	}
	if cc.CoreDNSConfig != nil {
		im.coreDNS = cc.CoreDNSConfig.CoreDNSImage
	}
	return im
}

// kubernetesOf is the Kubernetes version a kubelet reference's tag carries ("v1.35.2" of
// "ghcr.io/siderolabs/kubelet:v1.35.2"), or def when its tag is no version.
func kubernetesOf(kubelet, def string) string {
	nameTag, _, _ := strings.Cut(lastPathElement(kubelet), "@")
	if _, tag, ok := strings.Cut(nameTag, ":"); ok && kubernetesVersionRe.MatchString(tag) {
		return "v" + strings.TrimPrefix(tag, "v")
	}
	return def
}

// lastPathElement is what follows the last "/" (the name:tag part of a reference).
func lastPathElement(ref string) string {
	if i := strings.LastIndex(ref, "/"); i >= 0 {
		return ref[i+1:]
	}
	return ref
}
