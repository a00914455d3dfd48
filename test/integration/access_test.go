package integration

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestPrivateImageFallbackWithPullCredentials (issue 13): a private image (distribution's
// htpasswd registry refuses anonymous pulls) pulled by a real containerd 2.4 with CRI pull
// credentials, as the kubelet passes a pod's imagePullSecrets, while nodecache has none.
// nodecache answers 403 DENIED (no challenge, so containerd never sends it the node's
// credentials), containerd falls back to the registry itself with them, and the pull succeeds.
func TestPrivateImageFallbackWithPullCredentials(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd24)
	const user, password = "node", "kubelet-pull-secret"

	private := mirrortest.NewPrivateRegistry(t, user, password)
	host := upstreamHost(t, private)
	private.PushImage(t, "team/private", "v1", mirrortest.Image(t, 64*1024, 2, "linux/amd64"))
	nc := startNodecache(t, private) // no --upstream-auth

	certs := filepath.Join(t.TempDir(), "certs.d")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		t.Fatal(err)
	}
	c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs})
	opts := genOptions(t, c, nc.URL, host, certs)
	opts.Fallbacks = map[string]string{host: "http://" + host}
	rep, err := bcontainerd.Plan(os.DirFS("/"), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
	defer cancel()
	if err := (bootstrap.Applier{Root: "/"}).Apply(ctx, rep.Changes); err != nil {
		t.Fatal(err)
	}
	if rep.RestartRequired {
		c.Restart(t)
	}
	private.ResetRequests()

	ref := host + "/team/private:v1"
	if _, err := c.PullImage(ctx, ref); err == nil {
		t.Fatalf("containerd pulled the private image without credentials")
	}
	if _, err := c.PullImageWithAuth(ctx, ref, &runtimeapi.AuthConfig{Username: user, Password: password}); err != nil {
		t.Fatalf("containerd %s with pull credentials: %v\n%s", c.Version(), err, c.LogTail(40))
	}
	if ok, err := c.HasImage(ctx, ref); err != nil || !ok {
		t.Fatalf("image not in containerd's store after the pull: %v", err)
	}

	denied := 0
	for _, l := range nc.Requests(t) {
		if l.UserAgent != c.UserAgent() {
			continue
		}
		if l.Status == http.StatusUnauthorized {
			t.Errorf("nodecache challenged containerd (401) for %s %s: containerd would send it the node's credentials", l.Method, l.Path)
		}
		if l.Status == http.StatusForbidden && strings.Contains(l.Path, "/manifests/") {
			denied++
		}
	}
	if denied == 0 {
		t.Errorf("nodecache answered no manifest request of containerd with 403: %+v", nc.Requests(t))
	}
	fromContainerd, authed := 0, 0
	for _, r := range private.Requests() {
		switch {
		case strings.HasPrefix(r.UserAgent, "containerd/"):
			fromContainerd++
			if strings.HasPrefix(r.Authorization, "Basic ") {
				authed++
			}
		case r.Authorization != "":
			t.Errorf("a request of %q carried Authorization to the registry: %s %s", r.UserAgent, r.Method, r.Path)
		}
	}
	if fromContainerd == 0 || authed == 0 {
		t.Errorf("the registry saw %d requests from containerd, %d with its credentials; want the fallback pull with them", fromContainerd, authed)
	}
}

// serveTLS runs nodecache (mirror.Serve, as `serve --tls-cert --tls-key` does) on a loopback
// port with a certificate for 127.0.0.1 issued by ca; it returns the mirror URL and its log.
func serveTLS(t *testing.T, upstream *mirrortest.Registry, ca *mirrortest.CA) (string, *mirrortest.LogBuffer) {
	t.Helper()
	host := upstreamHost(t, upstream)
	up, err := name.ParseUpstream(host + "=http://" + host)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile, _ := ca.WriteFiles(t, dir, "nodecache", "127.0.0.1")
	buf := &mirrortest.LogBuffer{}
	log := zerolog.New(buf).With().Timestamp().Logger()
	cert, err := mirror.LoadCertificate(certFile, keyFile, log)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mirror.New(t.Context(), mirror.Options{Upstreams: []name.Upstream{up}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- mirror.Serve(ctx, m, mirror.ServeOptions{
			Listen: "127.0.0.1:0", TLS: cert, Logger: log, ShutdownTimeout: 5 * time.Second,
			OnListen: func(a net.Addr) { addr <- a },
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = m.Close()
		if t.Failed() {
			t.Logf("nodecache log:\n%s", buf.String())
		}
	})
	select {
	case a := <-addr:
		return "https://" + a.String(), buf
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("nodecache never listened")
	}
	return "", nil
}

// TestHTTPSMirrorContainerd (issue 13): nodecache serving TLS; `nodecache gen containerd
// --mirror https://… --mirror-ca` writes the CA into hosts.toml; a real containerd 2.4 pulls
// through the https mirror.
func TestHTTPSMirrorContainerd(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd24)

	upstream := appUpstream(t, 64*1024, 2)
	host := upstreamHost(t, upstream)
	ca := mirrortest.NewCA(t)
	mirrorURL, log := serveTLS(t, upstream, ca)
	caFile := filepath.Join(t.TempDir(), "mirror-ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}

	certs := filepath.Join(t.TempDir(), "certs.d")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		t.Fatal(err)
	}
	c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs})
	var rep struct {
		RestartRequired bool   `json:"restart_required"`
		HostsDir        string `json:"hosts_dir"`
	}
	runNodecacheJSON(t, []string{"gen", "containerd", "--mirror", mirrorURL, "--mirror-ca", caFile,
		"--upstream", host, "--containerd-config", c.ConfigFile(), "--certs-dir", certs,
		"--containerd-version", c.Version(), "--output", "json"}, &rep)
	hostsToml := readFile(t, filepath.Join(rep.HostsDir, name.HostDir(host), "hosts.toml"))
	if !strings.Contains(hostsToml, caFile) || !strings.Contains(hostsToml, mirrorURL) {
		t.Fatalf("gen's hosts.toml does not name the https mirror and its CA:\n%s", hostsToml)
	}
	if rep.RestartRequired {
		c.Restart(t)
	}
	ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
	defer cancel()
	if _, err := c.PullImage(ctx, host+"/team/app:v1"); err != nil {
		t.Fatalf("containerd %s through the https mirror: %v\n%s", c.Version(), err, c.LogTail(40))
	}
	lines := nodecachetest.AccessLog(t, log)
	checkAccessLog(t, lines, c.UserAgent(), host)
	for _, r := range upstream.Requests() {
		if strings.HasPrefix(r.UserAgent, "containerd/") {
			t.Errorf("upstream saw containerd itself (bypass): %s %s", r.Method, r.Path)
		}
	}
}

// TestHTTPSMirrorSkopeo (issue 13): gen crio's drop-in and CA copy for an https mirror;
// skopeo (containers/image, CRI-O's pull library) copies an image through it over TLS, trusting
// the CA gen wrote under the certs directory.
func TestHTTPSMirrorSkopeo(t *testing.T) {
	t.Parallel()
	skopeo := runtimetest.Find(t, runtimetest.Skopeo)
	runtimetest.RequireLoopbackName(t, upstreamName)

	upstream := appUpstream(t, 4096, 2)
	host := upstreamHost(t, upstream)
	ca := mirrortest.NewCA(t)
	mirrorURL, log := serveTLS(t, upstream, ca)
	m := bootstraptest.Mirror(t, mirrorURL)
	root := t.TempDir()
	rep, err := crio.Plan(os.DirFS(root), crio.Options{Mirror: m, Upstreams: []string{host}, MirrorCA: ca.PEM})
	if err != nil {
		t.Fatal(err)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	dropIn := filepath.Join(root, crio.DefaultRegistriesDir, crio.DropInName)
	certDir := filepath.Join(root, crio.DefaultCertsDir, m.Host())
	if _, err := os.Stat(certDir); err != nil {
		t.Fatalf("gen crio wrote no CA directory for the mirror: %v", err)
	}
	run := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(t.Context(), skopeo, append([]string{"--insecure-policy", "--registries-conf", dropIn,
			"copy", "--override-os", "linux", "--override-arch", "amd64"}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		return cmd.CombinedOutput()
	}
	// containers/image reads a registry's CAs from <certs dir>/<host:port>/*.crt; skopeo's
	// --src-cert-dir points it at the directory gen wrote.
	if out, err := run("--src-cert-dir", certDir, "docker://"+host+"/team/app:v1", "dir:"+t.TempDir()); err != nil {
		t.Fatalf("skopeo copy through the https mirror: %v\n%s", err, out)
	}
	served := 0
	for _, l := range nodecachetest.AccessLog(t, log) {
		if strings.Contains(strings.ToLower(l.UserAgent), "skopeo") && l.Status == http.StatusOK && strings.Contains(l.Path, "/blobs/") {
			served++
		}
	}
	if served < 3 {
		t.Errorf("nodecache served skopeo %d blobs over https, want >= 3 (config + 2 layers)", served)
	}
	if upstream.Count(http.MethodGet, "/blobs/") == 0 {
		t.Error("the upstream served no blob: the image did not come through nodecache")
	}
}
