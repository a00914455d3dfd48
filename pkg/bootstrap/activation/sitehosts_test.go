package activation

import (
	"os"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// A site's own docker.io hosts.toml: containerd pulls from Docker Hub directly.
const siteDockerHosts = "# our site file\nserver = \"https://registry-1.docker.io\"\n"

// genAdopt runs gen containerd's real plan over the node (the site's hosts.toml is adopted: the
// mirror added as its first host between gen's marker lines) and applies it.
func (n *testNode) genAdopt(upstreams ...string) {
	n.t.Helper()
	rep, err := bcontainerd.Plan(os.DirFS(n.Root), bcontainerd.Options{Mirror: bootstraptest.Mirror(n.t, mirrorURL), Upstreams: upstreams, Daemon: bcontainerd.Release{Major: 2, Minor: 4}})
	if err != nil {
		n.t.Fatalf("gen containerd plan: %v", err)
	}
	if len(rep.Adopted) == 0 {
		n.t.Fatalf("gen adopted nothing: %+v", rep.Changes)
	}
	bootstraptest.Apply(n.t, n.Root, rep.Changes)
}

// status judges every registry whose hosts.toml names the mirror as containerd's parser reads
// it — nodecache's own file, a site file gen adopted, a hand-written one — and says so when
// nothing tells which host the mirror is (newuser F7: an adopted file read NOT ACTIVE, "no
// hosts.toml written by nodecache", telling the user to run the gen they had just run).
func TestContainerdSiteHosts(t *testing.T) {
	t.Parallel()
	const dockerFile = certsDir + "/docker.io/hosts.toml"
	runHostsCases(t, []hostsCase{
		{name: "adopted by gen, --mirror", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts, t0)
			n.genAdopt("docker.io")
		}, mirror: mirrorURL, state: Active, has: "puts the mirror first for docker.io"},
		{name: "adopted by gen, mirror learnt from gen's block", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts, t0)
			n.genAdopt("docker.io")
		}, state: Active, has: "docker.io"},
		{name: "adopted by gen, another --mirror", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts, t0)
			n.genAdopt("docker.io")
		}, mirror: "http://127.0.0.1:5001", state: NotActive, has: dockerFile + ": first host is " + mirrorURL + "/v2, not the mirror http://127.0.0.1:5001"},
		{name: "hand-written, mirror first", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts+"\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n", t0)
		}, mirror: mirrorURL, state: Active, has: "puts the mirror first for docker.io"},
		{name: "hand-written, mirror first, no --mirror", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts+"\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n", t0)
		}, state: Unknown, has: "cannot tell which host is the mirror: no --mirror was given and no hosts.toml under " + certsDir + " was written by nodecache (" + dockerFile + " tries http://127.0.0.1:5000/v2 first)"},
		{name: "hand-written, --upstream, no --mirror", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts+"\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n", t0)
		}, upstreams: []string{"docker.io"}, state: Unknown, has: "cannot tell whether docker.io pull through the mirror: " + dockerFile + ": containerd tries http://127.0.0.1:5000/v2 first; no --mirror was given"},
		{name: "hand-written, mirror second", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts+"\n[host.\"https://corp.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n", t0)
		}, mirror: mirrorURL, state: NotActive, has: dockerFile + ": first host is https://corp.example/v2, not the mirror " + mirrorURL},
		{name: "site file without the mirror", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts, t0)
		}, mirror: mirrorURL, state: NotActive, has: "names the mirror " + mirrorURL + " (" + dockerFile + " tries https://registry-1.docker.io/v2 first)"},
		{name: "site file without the mirror, --upstream", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts, t0)
		}, mirror: mirrorURL, upstreams: []string{"docker.io"}, state: NotActive, has: dockerFile + ": first host is https://registry-1.docker.io/v2, not the mirror"},
		{name: "site file without the mirror, no --mirror", setup: func(n *testNode) {
			n.file(dockerFile, siteDockerHosts, t0)
		}, state: NotActive, has: "puts a mirror first (" + dockerFile + " tries https://registry-1.docker.io/v2 first)"},
		{name: "site file with another mirror, no --mirror", setup: func(n *testNode) {
			n.file(dockerFile, "server = \"https://registry-1.docker.io\"\n[host.\"https://corp.example\"]\n", t0)
		}, state: Unknown, has: dockerFile + " tries https://corp.example/v2 first"},
		{name: "site registry beside ours is not judged", setup: func(n *testNode) {
			n.withHosts(certsDir, t0)
			n.file(certsDir+"/registry.local:5000/hosts.toml", "server = \"http://registry.local:5000\"\n", t0)
		}, mirror: mirrorURL, state: Active, has: "docker.io, ghcr.io",
			rowName: "hosts registry.local:5000", row: "registry.local:5000/hosts.toml tries http://registry.local:5000/v2 first: not judged, it does not name the mirror " + mirrorURL + " (status --upstream registry.local:5000 judges it)"},
		{name: "site registry beside ours, named by --upstream", setup: func(n *testNode) {
			n.withHosts(certsDir, t0)
			n.file(certsDir+"/registry.local:5000/hosts.toml", "server = \"http://registry.local:5000\"\n", t0)
		}, upstreams: []string{"docker.io", "registry.local:5000"}, state: NotActive, has: "registry.local:5000/hosts.toml: first host is http://registry.local:5000/v2, not the mirror " + mirrorURL + " (the mirror of nodecache's hosts.toml files)"},
		{name: "hand-written file naming the mirror that does not parse", setup: func(n *testNode) {
			n.file(dockerFile, "server = \"https://registry-1.docker.io\"\n[host.\"http://127.0.0.1:5000\"\n", t0)
		}, mirror: mirrorURL, state: NotActive, has: dockerFile + " does not parse (toml: expected ']' to close table name): containerd ignores it and tries https://registry-1.docker.io/v2 first, not the mirror " + mirrorURL},
	})
}

// hostsCase is a containerd 2.4 node (newContainerd24Node) given setup's hosts files and judged
// for upstreams and, when set, mirror.
type hostsCase struct {
	name      string
	setup     func(n *testNode)
	mirror    string
	upstreams []string
	state     State
	has       string // in the verdict's reason
	row       string // when set, the text of the check row named rowName ("hosts <registry>")
	rowName   string
}

func runHostsCases(t *testing.T, tests []hostsCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := newContainerd24Node(t)
			tt.setup(n)
			o := n.hostsOpts(t, tt.upstreams, tt.mirror)
			r := n.evaluate(o)
			want(t, r, tt.state, tt.state.ExitCode(), tt.has)
			if tt.row != "" {
				if c, ok := check(r, RuntimeContainerd, tt.rowName); !ok || !strings.Contains(c.Reason, tt.row) {
					t.Fatalf("row %q: %+v, want it to say %q\n%s", tt.rowName, c, tt.row, dump(r))
				}
			}
		})
	}
}
