package containerd

import (
	"github.com/nodecache/nodecache/pkg/bootstrap"
)

// Plugin IDs of the table that holds the CRI registry configuration.
const (
	// PluginCRIv1 is containerd 1.x's CRI plugin (schema 2): plugins."io.containerd.grpc.v1.cri".registry.
	PluginCRIv1 = "io.containerd.grpc.v1.cri"
	// PluginImages is containerd 2.x's CRI image plugin (schemas 3 and 4):
	// plugins."io.containerd.cri.v1.images".registry.
	PluginImages = "io.containerd.cri.v1.images"
	// pluginGRPC is the schema-4 gRPC server plugin that carries the socket address.
	pluginGRPC = "io.containerd.server.v1.grpc"
)

// DefaultConfigPath2x is the config_path containerd 2.x uses on Linux when config_path and
// mirrors are both empty (plugins/cri/images/plugin.go): a list, which the transfer service reads
// as ONE directory (containerd #12415, #12636, #12808).
const DefaultConfigPath2x = "/etc/containerd/certs.d:/etc/docker/certs.d"

// DefaultConfig is containerd's default --config.
const DefaultConfig = "/etc/containerd/config.toml"

// DefaultSocket is containerd's default gRPC address.
const DefaultSocket = "/run/containerd/containerd.sock"

// DefaultCertsDir is where gen points a config_path it has to set.
const DefaultCertsDir = "/etc/containerd/certs.d"

// daemon captures the loader rules of one containerd release line.
type daemon struct {
	v bootstrap.Version
}

// v2 reports containerd 2.x rules: per-file migration, deep merge of plugin tables,
// cri.v1.images.
func (d daemon) v2() bool { return d.v.Major >= 2 }

// configVersion is the highest schema the daemon loads, and the version every file is migrated
// to (cmd/containerd/server/config: version.ConfigVersion): 2 for 1.x, 3 for 2.0–2.2, 4 from 2.3.
func (d daemon) configVersion() int {
	switch {
	case !d.v2():
		return 2
	case d.v.AtLeast(2, 3):
		return 4
	default:
		return 3
	}
}

// pluginID is the plugin whose registry table the CRI image service reads.
func (d daemon) pluginID() string {
	if d.v2() {
		return PluginImages
	}
	return PluginCRIv1
}

// transferCapable reports a release whose CRI pulls go through the transfer service unless local
// pull is forced (containerd >= 2.1).
func (d daemon) transferCapable() bool { return d.v.AtLeast(2, 1) }
