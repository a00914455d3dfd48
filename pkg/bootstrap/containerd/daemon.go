package containerd

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
