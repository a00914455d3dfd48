package activation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	introspection "github.com/containerd/containerd/api/services/introspection/v1"
	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// What a running containerd says about itself, over its gRPC socket (which release says what:
// bcontainerd.Release):
//   - version service: the daemon's version (decides which evidence exists);
//   - ≥ 2.4: introspection PluginInfo(type io.containerd.cri.v1, id images) exports
//     "RegistryConfigPath", the config_path the CRI image service was built with (after
//     containerd's Linux default was applied; plugins/cri/images/plugin.go);
//   - 1.x: CRI RuntimeService/Status with verbose=true returns info["config"], the CRI plugin's
//     configuration as JSON, with registry.configPath;
//   - 2.0–2.3: neither carries the registry configuration.

// Introspection coordinates of the CRI image service plugin in containerd 2.x.
const (
	criImagesPluginType = "io.containerd.cri.v1"
	criImagesPluginID   = "images"
	exportConfigPath    = "RegistryConfigPath"
)

// containerdClient talks to one containerd socket.
type containerdClient struct {
	conn *grpc.ClientConn
}

// dialContainerd prepares a client for the unix socket at path (no I/O until the first call).
func dialContainerd(path string) (*containerdClient, error) {
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)
	if err != nil {
		return nil, fmt.Errorf("containerd socket %s: %w", path, err)
	}
	return &containerdClient{conn: conn}, nil
}

func (c *containerdClient) Close() error { return c.conn.Close() }

// Version asks the version service: the version as the daemon says it ("v2.4.2", shown in
// reports) and the release it names (bcontainerd.ReportedRelease; an error when it names none).
func (c *containerdClient) Version(ctx context.Context) (string, bcontainerd.Release, error) {
	resp, err := versionapi.NewVersionClient(c.conn).Version(ctx, &emptypb.Empty{})
	if err != nil {
		return "", bcontainerd.Release{}, fmt.Errorf("containerd version: %w", err)
	}
	raw := resp.GetVersion()
	r, err := bcontainerd.ReportedRelease(raw)
	if err != nil {
		return "", bcontainerd.Release{}, err
	}
	return raw, r, nil
}

// errNoExport reports a CRI images plugin that does not export RegistryConfigPath.
var errNoExport = errors.New("the CRI images plugin exports no " + exportConfigPath)

// RegistryConfigPath asks introspection for the CRI images plugin's RegistryConfigPath export.
// An init error of the plugin is returned as an error: the CRI image service is then not
// running at all.
func (c *containerdClient) RegistryConfigPath(ctx context.Context) (string, error) {
	resp, err := introspection.NewIntrospectionClient(c.conn).PluginInfo(ctx, &introspection.PluginInfoRequest{
		Type: criImagesPluginType, ID: criImagesPluginID,
	})
	if err != nil {
		return "", fmt.Errorf("introspection plugin %s.%s: %w", criImagesPluginType, criImagesPluginID, err)
	}
	p := resp.GetPlugin()
	if ie := p.GetInitErr(); ie != nil && ie.GetCode() != int32(codes.OK) {
		return "", fmt.Errorf("introspection plugin %s.%s failed to load: %s", criImagesPluginType, criImagesPluginID, ie.GetMessage())
	}
	v, ok := p.GetExports()[exportConfigPath]
	if !ok {
		return "", errNoExport
	}
	return v, nil
}

// CRIPluginFailures lists, from introspection's plugin list, the CRI plugins that failed to
// initialise, each as "<type>.<id>: <init error>": on 2.x every io.containerd.cri.v1 plugin
// (images, runtime) and io.containerd.grpc.v1 cri, on 1.x io.containerd.grpc.v1 cri (where
// inline registry.mirrors next to config_path stops it). A daemon that lists no CRI plugin at
// all (disabled_plugins) is reported as one failure too: the kubelet cannot use it.
func (c *containerdClient) CRIPluginFailures(ctx context.Context) ([]string, error) {
	resp, err := introspection.NewIntrospectionClient(c.conn).Plugins(ctx, &introspection.PluginsRequest{})
	if err != nil {
		return nil, fmt.Errorf("introspection plugins: %w", err)
	}
	var failed []string
	found := false
	for _, p := range resp.GetPlugins() {
		if p.GetType() != criImagesPluginType && (p.GetType() != "io.containerd.grpc.v1" || p.GetID() != "cri") {
			continue
		}
		found = true
		if ie := p.GetInitErr(); ie != nil && ie.GetCode() != int32(codes.OK) {
			failed = append(failed, fmt.Sprintf("%s.%s: %s", p.GetType(), p.GetID(), ie.GetMessage()))
		}
	}
	if !found {
		failed = append(failed, "no CRI plugin is registered (disabled_plugins?)")
	}
	return failed, nil
}

// CRIConfigPath asks CRI Status (verbose) for the loaded registry.configPath (containerd 1.x).
// The second result is false when the CRI config carries no registry section.
func (c *containerdClient) CRIConfigPath(ctx context.Context) (string, bool, error) {
	resp, err := runtimeapi.NewRuntimeServiceClient(c.conn).Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return "", false, fmt.Errorf("CRI status: %w", err)
	}
	raw, ok := resp.GetInfo()["config"]
	if !ok {
		return "", false, errors.New(`CRI status: verbose info has no "config"`)
	}
	var cfg struct {
		Registry *struct {
			ConfigPath string `json:"configPath"`
		} `json:"registry"`
	}
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return "", false, fmt.Errorf("CRI status: config is not JSON: %w", err)
	}
	if cfg.Registry == nil {
		return "", false, nil
	}
	return cfg.Registry.ConfigPath, true, nil
}

// unreachable reports errors that mean nobody answered on the socket.
func unreachable(err error) bool {
	s, ok := status.FromError(errors.Unwrap(err))
	if !ok {
		s, ok = status.FromError(err)
	}
	return ok && (s.Code() == codes.Unavailable || s.Code() == codes.DeadlineExceeded)
}

func itoa(n int) string { return strconv.Itoa(n) }
