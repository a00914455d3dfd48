package activation

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	introspection "github.com/containerd/containerd/api/services/introspection/v1"
	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testNode is a synthetic node: a host root with runtime files and a procfs tree. Its
// containerd, when started, is an in-process gRPC server speaking containerd's real version,
// introspection and CRI protocols on the node's socket.
type testNode struct {
	t    *testing.T
	Root string // host root
	Proc *procTree
}

func newTestNode(t *testing.T) *testNode {
	t.Helper()
	// Short path: unix socket paths are limited to 108 bytes.
	root, err := os.MkdirTemp("", "nc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	return &testNode{t: t, Root: root, Proc: newProcTree(t)}
}

// file writes a host file with mtime at unix second sec.
func (n *testNode) file(path, content string, sec int64) {
	n.t.Helper()
	p := filepath.Join(n.Root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
	n.touch(path, sec)
}

// fileAt writes a host file with mtime at.
func (n *testNode) fileAt(path, content string, at time.Time) {
	n.t.Helper()
	n.file(path, content, at.Unix())
	if err := os.Chtimes(filepath.Join(n.Root, path), at, at); err != nil {
		n.t.Fatal(err)
	}
}

func (n *testNode) touch(path string, sec int64) {
	n.t.Helper()
	ts := time.Unix(sec, 0)
	if err := os.Chtimes(filepath.Join(n.Root, path), ts, ts); err != nil {
		n.t.Fatal(err)
	}
}

// fakeContainerd answers on a unix socket like a containerd daemon of the given version.
type fakeContainerd struct {
	version string
	// exports of the CRI images plugin (2.4+); nil = plugin not found.
	exports map[string]string
	// criConfig is the verbose CRI status "config" JSON (1.x).
	criConfig string
	// criInitErr, when set, is the init error introspection lists for the CRI plugin.
	criInitErr string
}

type fakeVersion struct {
	versionapi.UnimplementedVersionServer
	*fakeContainerd
}

type fakeIntrospection struct {
	introspection.UnimplementedIntrospectionServer
	*fakeContainerd
}

type fakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	*fakeContainerd
}

func (f fakeVersion) Version(context.Context, *emptypb.Empty) (*versionapi.VersionResponse, error) {
	return &versionapi.VersionResponse{Version: f.version, Revision: "test"}, nil
}

func (f fakeIntrospection) PluginInfo(_ context.Context, r *introspection.PluginInfoRequest) (*introspection.PluginInfoResponse, error) {
	if r.GetType() != criImagesPluginType || r.GetID() != criImagesPluginID || f.exports == nil {
		return &introspection.PluginInfoResponse{}, nil
	}
	return &introspection.PluginInfoResponse{Plugin: &introspection.Plugin{Type: r.GetType(), ID: r.GetID(), Exports: f.exports}}, nil
}

func (f fakeIntrospection) Plugins(context.Context, *introspection.PluginsRequest) (*introspection.PluginsResponse, error) {
	p := &introspection.Plugin{Type: "io.containerd.grpc.v1", ID: "cri"}
	if !strings.HasPrefix(strings.TrimPrefix(f.version, "v"), "1.") {
		p = &introspection.Plugin{Type: criImagesPluginType, ID: criImagesPluginID}
	}
	if f.criInitErr != "" {
		p.InitErr = status.New(codes.Unknown, f.criInitErr).Proto()
	}
	return &introspection.PluginsResponse{Plugins: []*introspection.Plugin{
		{Type: "io.containerd.content.v1", ID: "content"}, p}}, nil
}

func (f fakeCRI) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "cri-o", RuntimeVersion: f.version, RuntimeApiVersion: "v1"}, nil
}

func (f fakeCRI) Status(_ context.Context, r *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	resp := &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{}}
	if r.GetVerbose() && f.criConfig != "" {
		resp.Info = map[string]string{"config": f.criConfig}
	}
	return resp, nil
}

// serveContainerd starts a fake containerd of version on the node's socket path.
func (n *testNode) serveContainerd(socket string, f *fakeContainerd) {
	n.t.Helper()
	p := filepath.Join(n.Root, socket)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		n.t.Fatal(err)
	}
	_ = os.Remove(p)
	l, err := net.Listen("unix", p)
	if err != nil {
		n.t.Fatal(err)
	}
	s := grpc.NewServer()
	versionapi.RegisterVersionServer(s, fakeVersion{fakeContainerd: f})
	introspection.RegisterIntrospectionServer(s, fakeIntrospection{fakeContainerd: f})
	runtimeapi.RegisterRuntimeServiceServer(s, fakeCRI{fakeContainerd: f})
	go func() { _ = s.Serve(l) }()
	n.t.Cleanup(s.Stop)
}

func criStatusConfig(configPath string) string {
	b, _ := json.Marshal(map[string]any{"registry": map[string]any{"configPath": configPath, "mirrors": nil}, "containerd": map[string]any{"snapshotter": "overlayfs"}})
	return string(b)
}

// containerdProc adds a containerd process (pid) started at unix second sec that listens on
// socket.
func (n *testNode) containerdProc(pid int, sec int64, socket string, args ...string) {
	n.Proc.addProcess(pid, "containerd", ticksAt(sec), append([]string{"/usr/bin/containerd"}, args...)...)
	n.Proc.listen(pid, socket, uint64(7000+pid))
}

// newContainerdNode is a node whose containerd f (pid 1000, on sock) started at unix second
// started, with config.toml cfg written at cfgWritten; the hosts files are the test's to write.
func newContainerdNode(t *testing.T, f *fakeContainerd, started int64, cfg string, cfgWritten int64) *testNode {
	t.Helper()
	n := newTestNode(t)
	n.serveContainerd(sock, f)
	n.containerdProc(1000, started, sock)
	n.file(cfgFile, cfg, cfgWritten)
	return n
}

// newContainerd24Node is a node whose containerd 2.4.2 (pid 1000, started at t0, on sock)
// exports config_path certsDir, which its config.toml set before the start.
func newContainerd24Node(t *testing.T) *testNode {
	t.Helper()
	return newContainerdNode(t, &fakeContainerd{version: "v2.4.2", exports: map[string]string{exportConfigPath: certsDir}}, t0, v3Config(certsDir, ""), t0-10)
}

// newContainerd23Node is a node whose containerd 2.3 (which exports nothing of its registry
// configuration) started at started, with config.toml and hosts.toml files naming certsDir
// written at written (Unix seconds).
func newContainerd23Node(t *testing.T, started, written int64) *testNode {
	t.Helper()
	n := newContainerdNode(t, &fakeContainerd{version: "v2.3.1"}, started, v3Config(certsDir, ""), written)
	n.withHosts(certsDir, written)
	return n
}

// hostsOpts are n's options for upstreams and, when mirrorURL is set, that mirror, probed by
// a client whose every answer is the mirror's (answer) from a node with no addresses.
func (n *testNode) hostsOpts(t *testing.T, upstreams []string, mirrorURL string) Options {
	t.Helper()
	o := n.opts()
	o.Upstreams = upstreams
	if mirrorURL != "" {
		o.Mirror = parseMirror(t, mirrorURL)
		o.NodeAddrs = func() ([]netip.Addr, error) { return nil, nil }
		o.HTTPClient = &http.Client{Transport: answer{}}
	}
	return o
}

// mirrorOpts are n's options for its containerd with --mirror mirrorURL.
func (n *testNode) mirrorOpts(t *testing.T, mirrorURL string) Options {
	t.Helper()
	o := n.opts()
	o.Mirror = parseMirror(t, mirrorURL)
	o.Runtime = RuntimeContainerd
	return o
}

func (n *testNode) opts() Options {
	return Options{Host: n.Proc.Host(n.Root), APITimeout: 2 * time.Second}
}

func (n *testNode) evaluate(o Options) *Report {
	n.t.Helper()
	r, err := Evaluate(n.t.Context(), o)
	if err != nil {
		n.t.Fatalf("Evaluate: %v", err)
	}
	return r
}

const hostsTOMLFmt = `# managed by nodecache
server = "%s"

[host."%s"]
  capabilities = ["pull", "resolve"]
`
