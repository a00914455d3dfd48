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

// TalosJoinSet is the set of images a Talos worker pulls to join a cluster.
type TalosJoinSet struct {
	// TalosVersion is the Talos release machinery was built for, e.g. "v1.13.8".
	TalosVersion string `json:"talos_version"`
	// KubernetesVersion is the Kubernetes version the kubelet and kube-proxy tags carry,
	// e.g. "v1.36.2".
	KubernetesVersion string `json:"kubernetes_version"`
	// Images are the references, in pull order: kubelet, kube-proxy, pause, flannel.
	Images []string `json:"images"`
}

var kubernetesVersionRe = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

// TalosJoinImages returns the Talos worker join set from Talos machinery
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
	k8s := constants.DefaultKubernetesVersion
	if kubernetesVersion != "" {
		if bad := checkChars(kubernetesVersion, 64); bad != "" {
			return TalosJoinSet{}, &RefusedError{What: "--kubernetes-version", Value: kubernetesVersion,
				Reason: bad + "; want vMAJOR.MINOR.PATCH, e.g. v1.36.2"}
		}
		if !kubernetesVersionRe.MatchString(kubernetesVersion) {
			return TalosJoinSet{}, &RefusedError{What: "--kubernetes-version", Value: kubernetesVersion,
				Reason: "want vMAJOR.MINOR.PATCH[-pre], e.g. v1.36.2"}
		}
		k8s = kubernetesVersion
	}
	k8s = "v" + strings.TrimPrefix(k8s, "v")
	set := TalosJoinSet{
		TalosVersion:      strings.TrimSpace(gendata.VersionTag),
		KubernetesVersion: k8s,
		Images: []string{
			fmt.Sprintf("%s:%s", constants.KubeletImage, k8s),
			fmt.Sprintf("%s:%s", constants.KubeProxyImage, k8s),
			talosPauseImage,
			// Talos mirrors flannel to ghcr.io/siderolabs and tags it vX.Y.Z; machinery's
			// FlannelVersion carries the bare X.Y.Z since 1.13.
			"ghcr.io/siderolabs/flannel:v" + strings.TrimPrefix(constants.FlannelVersion, "v"),
		},
	}
	return set, nil
}
