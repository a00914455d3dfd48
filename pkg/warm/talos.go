package warm

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
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
	// KubeletImage and KubeProxyImage are machinery's repositories (no tag).
	KubeletImage, KubeProxyImage string
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
// *RefusedError: a malformed version, or a release the table does not know (the message lists
// the known ones).
func TalosJoinImagesFor(talosVersion, kubernetesVersion string) (TalosJoinSet, error) {
	if talosVersion == "" {
		return TalosJoinImages(kubernetesVersion)
	}
	known := strings.Join(TalosReleases(), ", ")
	refuse := func(reason string) (TalosJoinSet, error) {
		return TalosJoinSet{}, &RefusedError{What: "--talos-version", Value: talosVersion, Reason: reason}
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
	note := ""
	for i := range talosReleases {
		r := &talosReleases[i]
		if r.Version == want {
			rel = r
			break
		}
		if strings.HasPrefix(r.Version, minor) {
			rel = r // the table's release of that minor (the last one listed wins)
		}
	}
	switch {
	case rel == nil:
		return refuse("not a Talos release this build knows; known: " + known + " (another patch of one of their minors is served from it)")
	case rel.Version != want:
		note = fmt.Sprintf("Talos %s is not in this build's table; using the images of %s, the %sx release it knows", want, rel.Version, minor)
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

func (s *TalosJoinSet) add(role, ref string) {
	s.Images = append(s.Images, ref)
	s.roles = append(s.roles, role)
}

// kubernetesTag is kubernetesVersion checked and v-prefixed, or def when it is empty.
func kubernetesTag(kubernetesVersion, def string) (string, error) {
	k8s := def
	if kubernetesVersion != "" {
		if bad := checkChars(kubernetesVersion, 64); bad != "" {
			return "", &RefusedError{What: "--kubernetes-version", Value: kubernetesVersion,
				Reason: bad + "; want vMAJOR.MINOR.PATCH, e.g. v1.36.2"}
		}
		if !kubernetesVersionRe.MatchString(kubernetesVersion) {
			return "", &RefusedError{What: "--kubernetes-version", Value: kubernetesVersion,
				Reason: "want vMAJOR.MINOR.PATCH[-pre], e.g. v1.36.2"}
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
// keeps the default. A malformed version is a *RefusedError.
func TalosJoinImages(kubernetesVersion string) (TalosJoinSet, error) {
	k8s, err := kubernetesTag(kubernetesVersion, constants.DefaultKubernetesVersion)
	if err != nil {
		return TalosJoinSet{}, err
	}
	set := TalosJoinSet{TalosVersion: strings.TrimSpace(gendata.VersionTag), KubernetesVersion: k8s}
	set.add("kubelet", fmt.Sprintf("%s:%s", constants.KubeletImage, k8s))
	set.add("kube-proxy", fmt.Sprintf("%s:%s", constants.KubeProxyImage, k8s))
	set.add("pause", talosPauseImage)
	// Talos mirrors flannel to ghcr.io/siderolabs and tags it vX.Y.Z; machinery's FlannelVersion
	// carries the bare X.Y.Z since 1.13.
	set.add("flannel", talosFlannelRepository+":v"+strings.TrimPrefix(constants.FlannelVersion, "v"))
	return set, nil
}
