package warm

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/gendata"

	"github.com/nodecache/nodecache/pkg/refusal"
)

// talosPauseImage is the sandbox (pause) image a Talos 1.13 worker pulls. It is the one image of
// the join set that machinery does not export: Talos pins it as images.DefaultSandboxImage in
// github.com/siderolabs/talos pkg/images/list.go ("defined as a constant in cri package of
// containerd, and it's not exported"), for the containerd that Talos release ships. Update it
// together with the machinery version in go.mod.
const talosPauseImage = "registry.k8s.io/pause:3.10.1"

//go:generate go run ./internal/talosgen -o talos_releases_gen.go

// talosFlannelRepository is where Talos mirrors flannel (tags vX.Y.Z): images.List in
// github.com/siderolabs/talos pkg/images/list.go; not in machinery.
const talosFlannelRepository = "ghcr.io/siderolabs/flannel"

// talosRelease is one row of the generated table (talos_releases_gen.go).
type talosRelease struct {
	// Version is the Talos release, e.g. "v1.12.4".
	Version string
	// Kubernetes is machinery's DefaultKubernetesVersion with a v prefix, e.g. "v1.35.0".
	Kubernetes string
	// KubeletImage, KubeProxyImage, APIServerImage, ControllerManagerImage and SchedulerImage
	// are machinery's repositories (no tag), tagged with Kubernetes where a config names none.
	KubeletImage, KubeProxyImage, APIServerImage, ControllerManagerImage, SchedulerImage string
	// CoreDNS and Etcd are the whole default references, as machinery's accessors join them for
	// an unset field: CoreDNSImage:DefaultCoreDNSVersion and EtcdImage:DefaultEtcdVersion, e.g.
	// "registry.k8s.io/coredns/coredns:v1.12.4" and "gcr.io/etcd-development/etcd:v3.6.5".
	CoreDNS, Etcd string
	// Flannel is machinery's FlannelVersion with a v prefix, e.g. "v0.27.4".
	Flannel string
	// Pause is the release's pause (sandbox) image, Talos' images.DefaultSandboxImage
	// (github.com/siderolabs/talos pkg/images/list.go), e.g. "registry.k8s.io/pause:3.10".
	Pause string
}

// TalosJoinSet is the set of images a Talos worker pulls to join a cluster.
type TalosJoinSet struct {
	// TalosVersion is the Talos release the images are for, e.g. "v1.13.8".
	TalosVersion string `json:"talos_version"`
	// KubernetesVersion is the Kubernetes version the kubelet and kube-proxy tags carry,
	// e.g. "v1.36.2".
	KubernetesVersion string `json:"kubernetes_version"`
	// Images are the references, in pull order: kubelet, kube-proxy, pause, flannel.
	Images []string `json:"images"`
	// Note says what the set could not follow exactly: another patch of a known minor served
	// from the release the table knows.
	Note string `json:"note,omitempty"`
	// roles names each of Images: kubelet, kube-proxy, pause, flannel.
	roles []string
}

var (
	kubernetesVersionRe = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)
	talosVersionRe      = regexp.MustCompile(`^v?([0-9]+)\.([0-9]+)\.([0-9]+)$`)
)

// TalosReleases returns the Talos releases TalosJoinImagesFor knows exactly, oldest first.
func TalosReleases() []string {
	out := make([]string, len(talosReleases))
	for i, r := range talosReleases {
		out[i] = r.Version
	}
	return out
}

// TalosJoinImagesFor returns the worker join set of a Talos release ("v1.12.4" or "1.12.4")
// from the generated table (talos_releases_gen.go, from each release's machinery constants):
// kubelet and kube-proxy at the release's Kubernetes version, its pause image, and
// ghcr.io/siderolabs/flannel at its flannel version. Another patch of a minor the table knows is
// served from that minor's release, with a Note naming it. An empty talosVersion is
// TalosJoinImages. kubernetesVersion overrides the kubelet and kube-proxy tag as there. Errors are
// refusals (refusal.Value): a malformed version, or a release the table does not know (the
// message lists the known ones).
func TalosJoinImagesFor(talosVersion, kubernetesVersion string) (TalosJoinSet, error) {
	rel, note, err := talosReleaseFor(talosVersion)
	if err != nil {
		return TalosJoinSet{}, err
	}
	k8s, err := kubernetesTag(kubernetesVersion, rel.Kubernetes)
	if err != nil {
		return TalosJoinSet{}, err
	}
	set := TalosJoinSet{TalosVersion: rel.Version, KubernetesVersion: k8s}
	set.add("kubelet", rel.KubeletImage+":"+k8s)
	set.add("kube-proxy", rel.KubeProxyImage+":"+k8s)
	set.add("pause", rel.Pause)
	set.add("flannel", talosFlannelRepository+":"+rel.Flannel)
	set.Note = note
	return set, nil
}

// talosReleaseFor returns the defaults of a Talos release ("v1.12.4" or "1.12.4"): its row of the
// generated table, or for another patch of a minor the table knows that minor's row with a note
// naming it. An empty talosVersion is linkedRelease. Errors are refusals (refusal.Value): a malformed
// version, or a release the table does not know (the message lists the known ones).
func talosReleaseFor(talosVersion string) (talosRelease, string, error) {
	if talosVersion == "" {
		return linkedRelease(), "", nil
	}
	refuse := func(reason string) (talosRelease, string, error) {
		return talosRelease{}, "", refusal.Value("--talos-version", talosVersion, reason)
	}
	if bad := checkChars(talosVersion, 64); bad != "" {
		return refuse(bad + "; want vMAJOR.MINOR.PATCH, e.g. v1.12.4")
	}
	m := talosVersionRe.FindStringSubmatch(talosVersion)
	if m == nil {
		return refuse("want vMAJOR.MINOR.PATCH, e.g. v1.12.4")
	}
	want := "v" + strings.TrimPrefix(talosVersion, "v")
	minor := "v" + m[1] + "." + m[2] + "."
	var rel *talosRelease
	for i := range talosReleases {
		r := &talosReleases[i]
		if r.Version == want {
			return *r, "", nil
		}
		if strings.HasPrefix(r.Version, minor) {
			rel = r // the table's release of that minor (the last one listed wins)
		}
	}
	if rel == nil {
		return refuse("not a Talos release this build knows; known: " + strings.Join(TalosReleases(), ", ") + " (another patch of one of their minors is served from it)")
	}
	return *rel, fmt.Sprintf("Talos %s is not in this build's table; using the images of %s, the %sx release it knows", want, rel.Version, minor), nil
}

// linkedRelease is the row of the Talos machinery this build links
// (github.com/siderolabs/talos/pkg/machinery/constants, the version in go.mod), joined as its
// v1alpha1 accessors join the defaults of unset fields; the pause image is talosPauseImage.
// TestTalosReleaseTable checks it equals the generated row of that release.
func linkedRelease() talosRelease {
	return talosRelease{
		Version:                strings.TrimSpace(gendata.VersionTag),
		Kubernetes:             "v" + strings.TrimPrefix(constants.DefaultKubernetesVersion, "v"),
		KubeletImage:           constants.KubeletImage,
		KubeProxyImage:         constants.KubeProxyImage,
		APIServerImage:         constants.KubernetesAPIServerImage,
		ControllerManagerImage: constants.KubernetesControllerManagerImage,
		SchedulerImage:         constants.KubernetesSchedulerImage,
		CoreDNS:                constants.CoreDNSImage + ":" + constants.DefaultCoreDNSVersion,
		Etcd:                   constants.EtcdImage + ":" + constants.DefaultEtcdVersion,
		// Talos mirrors flannel to ghcr.io/siderolabs and tags it vX.Y.Z; machinery's
		// FlannelVersion carries the bare X.Y.Z since 1.13.
		Flannel: "v" + strings.TrimPrefix(constants.FlannelVersion, "v"),
		Pause:   talosPauseImage,
	}
}

func (s *TalosJoinSet) add(role, ref string) {
	s.Images = append(s.Images, ref)
	s.roles = append(s.roles, role)
}

// kubernetesTag is kubernetesVersion checked and v-prefixed, or def when it is empty.
func kubernetesTag(kubernetesVersion, def string) (string, error) {
	k8s := def
	if kubernetesVersion != "" {
		if bad := checkChars(kubernetesVersion, 64); bad != "" {
			return "", refusal.Value("--kubernetes-version", kubernetesVersion, bad+"; want vMAJOR.MINOR.PATCH, e.g. v1.36.2")
		}
		if !kubernetesVersionRe.MatchString(kubernetesVersion) {
			return "", refusal.Value("--kubernetes-version", kubernetesVersion, "want vMAJOR.MINOR.PATCH[-pre], e.g. v1.36.2")
		}
		k8s = kubernetesVersion
	}
	return "v" + strings.TrimPrefix(k8s, "v"), nil
}

// TalosJoinImages returns the Talos worker join set from the Talos machinery this build links
// (github.com/siderolabs/talos/pkg/machinery/constants, the version in go.mod):
//
//   - kubelet:    constants.KubeletImage:v<k8s>   (ghcr.io/siderolabs/kubelet)
//   - kube-proxy: constants.KubeProxyImage:v<k8s> (registry.k8s.io/kube-proxy)
//   - pause:      talosPauseImage (pinned here, see its comment)
//   - flannel:    ghcr.io/siderolabs/flannel:v<constants.FlannelVersion> (Talos' default CNI)
//
// kubernetesVersion ("v1.36.2" or "1.36.2") overrides constants.DefaultKubernetesVersion; empty
// keeps the default. A malformed version is refused (refusal.Value).
func TalosJoinImages(kubernetesVersion string) (TalosJoinSet, error) {
	return TalosJoinImagesFor("", kubernetesVersion)
}
