package main

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// TestServeUpstreamAuthCredentialHelper (issue 13): the binary pulls from distribution's
// htpasswd registry with credentials a shell-script credential helper (credHelpers, found on
// PATH) hands out; the password is in no log line, even at debug level.
func TestServeUpstreamAuthCredentialHelper(t *testing.T) {
	t.Parallel()
	const user, password = "puller", "helper-pa55word-never-logged"
	private := mirrortest.NewPrivateRegistry(t, user, password)
	img := mirrortest.Image(t, 8192, 2, "linux/amd64")
	private.PushImage(t, "team/private", "v1", img)

	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	helperLog := filepath.Join(dir, "helper.log")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	// The docker-credential-helpers protocol: the action is the argument, the server on stdin,
	// the answer a JSON object on stdout; an unknown server is "credentials not found".
	script := `#!/bin/sh
read -r server
echo "$1 $server" >>` + helperLog + `
if [ "$1" = get ] && [ "$server" = private.test ]; then
	printf '{"ServerURL":"%s","Username":"` + user + `","Secret":"` + password + `"}\n' "$server"
	exit 0
fi
echo "credentials not found in native keychain"
exit 1
`
	if err := os.WriteFile(filepath.Join(bin, "docker-credential-nctest"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	config := writeFile(t, dir, "config.json", `{"credHelpers":{"private.test":"nctest"}}`)
	listen := nodecachetest.FreeAddr(t)
	logs := startServe(t, []string{"PATH=" + bin + ":" + os.Getenv("PATH")}, nil, "http://"+listen+"/readyz",
		"--listen", listen, "--root", filepath.Join(dir, "root"), "--log-level", "debug",
		"--upstream", "private.test="+private.URL.String(),
		"--upstream-auth", "private.test="+config)

	if _, err := nodecachetest.PullValid(t.Context(), listen+"/private.test/team/private:v1"); err != nil {
		t.Fatal(err)
	}
	calls, err := os.ReadFile(helperLog)
	if err != nil || !strings.Contains(string(calls), "get private.test") {
		t.Fatalf("the credential helper was not asked for private.test (%v): %q", err, calls)
	}
	encoded := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(nil, 1<<20)
	lines := 0
	for sc.Scan() {
		lines++
		if strings.Contains(sc.Text(), password) || strings.Contains(sc.Text(), encoded) {
			t.Errorf("log line carries the password: %s", sc.Text())
		}
	}
	if lines == 0 || !strings.Contains(logs.String(), `"message":"request"`) {
		t.Fatalf("no access log to check:\n%s", logs.String())
	}
}

// TestServeTLS (issue 13): --tls-cert/--tls-key serve HTTPS, which curl --cacert accepts; TLS
// 1.1 and plain HTTP are refused; a key without a certificate is a usage error (exit 2).
func TestServeTLS(t *testing.T) {
	t.Parallel()
	curl := runtimetest.Find(t, runtimetest.Curl)
	up := mirrortest.NewRegistry(t)
	dir := t.TempDir()
	ca := mirrortest.NewCA(t)
	cert, key, caFile := ca.WriteFiles(t, dir, "server", "127.0.0.1", "localhost")
	listen := nodecachetest.FreeAddr(t)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}}
	startServe(t, nil, client, "https://"+listen+"/readyz",
		"--listen", listen, "--root", filepath.Join(dir, "root"),
		"--upstream", "upstream.test="+up.URL.String(), "--tls-cert", cert, "--tls-key", key)

	out, err := exec.Command(curl, "-sS", "--cacert", caFile, "https://"+listen+"/v2/").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "{}" {
		t.Fatalf("curl --cacert https://%s/v2/: %v: %s", listen, err, out)
	}
	if out, err := exec.Command(curl, "-sS", "https://"+listen+"/v2/").CombinedOutput(); err == nil {
		t.Errorf("curl without the CA succeeded: %s", out)
	}
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: ca.Pool(), MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}}}
	if resp, err := old.Get("https://" + listen + "/v2/"); err == nil {
		resp.Body.Close()
		t.Errorf("a TLS 1.1 client was served")
	}
	if resp, err := http.Get("http://" + listen + "/v2/"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP to the TLS listener served: %s", b)
		}
	}

	cmd := exec.Command(binary, "serve", "--listen", nodecachetest.FreeAddr(t), "--root", filepath.Join(dir, "root2"), "--tls-key", key)
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--tls-cert and --tls-key go together") {
		t.Errorf("--tls-key alone: %v, %s; want exit 2 naming both flags", err, out)
	}
}

// connectProxy is an HTTP CONNECT proxy on loopback that records the targets it was asked for
// and dials every *.test name at 127.0.0.1.
type connectProxy struct {
	*httptest.Server
	mu      sync.Mutex
	targets []string
}

func newConnectProxy(t *testing.T) *connectProxy {
	t.Helper()
	p := &connectProxy{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		p.mu.Lock()
		p.targets = append(p.targets, r.Host)
		p.mu.Unlock()
		host, port, err := net.SplitHostPort(r.Host)
		if err != nil || !strings.HasSuffix(host, ".test") {
			http.Error(w, "only *.test targets", http.StatusForbidden)
			return
		}
		upstream, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			_ = upstream.Close()
			return
		}
		_, _ = conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
		go func() {
			_, _ = io.Copy(upstream, buf)
			_ = upstream.Close()
		}()
		_, _ = io.Copy(conn, upstream)
		_ = conn.Close()
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *connectProxy) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.targets...)
}

// TestServeUpstreamProxyAndCA (issue 13): upstream traffic goes through HTTPS_PROXY (an https
// upstream named upstream.test with a private CA given by --upstream-ca; Go never proxies
// loopback addresses, hence the name), and NO_PROXY takes it out again.
func TestServeUpstreamProxyAndCA(t *testing.T) {
	t.Parallel()
	ca := mirrortest.NewCA(t)
	handler := mirrortest.NewHandler(t)
	push := httptest.NewServer(handler)
	t.Cleanup(push.Close)
	tlsUp := httptest.NewUnstartedServer(handler)
	tlsUp.TLS = ca.TLSConfig(t, "upstream.test")
	tlsUp.StartTLS()
	t.Cleanup(tlsUp.Close)
	(&mirrortest.Registry{Addr: push.Listener.Addr().String()}).PushImage(t, "team/app", "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))
	_, port, _ := net.SplitHostPort(tlsUp.Listener.Addr().String())
	upName := "upstream.test:" + port

	for _, tc := range []struct {
		name      string
		noProxy   string
		viaProxy  bool
		needHosts bool
		noCA      bool
	}{
		{name: "through HTTPS_PROXY", viaProxy: true},
		{name: "without --upstream-ca the private CA is not trusted", viaProxy: true, noCA: true},
		{name: "NO_PROXY bypasses the proxy", noProxy: "upstream.test", needHosts: true},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			if tc.needHosts {
				// Direct, the name must resolve to loopback (/etc/hosts, .ci/build-tools.sh).
				runtimetest.RequireLoopbackName(t, "upstream.test")
			}
			proxy := newConnectProxy(t)
			dir := t.TempDir()
			caFile := writeFile(t, dir, "upstream-ca.pem", string(ca.PEM))
			listen := nodecachetest.FreeAddr(t)
			env := []string{"HTTPS_PROXY=" + proxy.URL, "https_proxy=" + proxy.URL, "NO_PROXY=" + tc.noProxy, "no_proxy=" + tc.noProxy}
			args := []string{"--listen", listen, "--root", filepath.Join(dir, "root"), "--upstream", upName + "=https://" + upName}
			if !tc.noCA {
				args = append(args, "--upstream-ca", upName+"="+caFile)
			}
			startServe(t, env, nil, "http://"+listen+"/readyz", args...)
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+listen+"/v2/team/app/manifests/v1?ns="+upName, nil)
			req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tc.noCA {
				if resp.StatusCode == http.StatusOK || !strings.Contains(string(body), "certificate") {
					t.Errorf("without --upstream-ca: %d %s; want an error naming the certificate", resp.StatusCode, body)
				}
			} else if resp.StatusCode != http.StatusOK {
				t.Fatalf("manifest through nodecache: %d %s", resp.StatusCode, body)
			}
			targets := proxy.seen()
			if tc.viaProxy && (len(targets) == 0 || targets[0] != upName) {
				t.Errorf("proxy saw CONNECT %q, want %s", targets, upName)
			}
			if !tc.viaProxy && len(targets) != 0 {
				t.Errorf("NO_PROXY=%s but the proxy saw CONNECT %q", tc.noProxy, targets)
			}
		})
	}
}

// TestServeRefusesBadAccessInput (issue 13): bad --pull-allow, --upstream-auth, --upstream-ca
// and --tls-* values exit 2 with a message naming the flag and what is accepted; a refused
// credentials file never shows its secret.
func TestServeRefusesBadAccessInput(t *testing.T) {
	t.Parallel()
	const secret = "t0p-secret-in-the-file"
	dir := t.TempDir()
	other := writeFile(t, dir, "other.json", `{"auths":{"quay.io":{"username":"u","password":"`+secret+`"}}}`)
	broken := writeFile(t, dir, "broken.json", `{"auths":{"ghcr.io":{"password":"`+secret+`"`)
	notPEM := writeFile(t, dir, "ca.txt", "not a certificate "+secret)
	up := []string{"serve", "--listen", nodecachetest.FreeAddr(t), "--root", filepath.Join(dir, "root"), "--upstream", "ghcr.io=https://ghcr.io"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"pull-allow not a CIDR", []string{"--pull-allow", "10.0.0.0/33"}, "--pull-allow"},
		{"pull-allow a name", []string{"--pull-allow", "nodes.example"}, "want a CIDR"},
		{"upstream-auth without FILE", []string{"--upstream-auth", "ghcr.io"}, "want NAME=FILE"},
		{"upstream-auth unknown upstream", []string{"--upstream-auth", "quay.io=" + other}, "not among the --upstream names"},
		{"upstream-auth missing file", []string{"--upstream-auth", "ghcr.io=/nonexistent/config.json"}, "no such file"},
		{"upstream-auth no entry", []string{"--upstream-auth", "ghcr.io=" + other}, `has no credentials for ghcr.io`},
		{"upstream-auth broken file", []string{"--upstream-auth", "ghcr.io=" + broken}, "not a docker config.json"},
		{"upstream-ca not PEM", []string{"--upstream-ca", "ghcr.io=" + notPEM}, "no PEM certificate"},
		{"tls-cert alone", []string{"--tls-cert", notPEM}, "go together"},
		{"tls pair not PEM", []string{"--tls-cert", notPEM, "--tls-key", notPEM}, "--tls-cert/--tls-key"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			out, err := exec.Command(binary, append(append([]string{}, up...), tc.args...)...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("%v: err %v, want exit 2\n%s", tc.args, err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, tc.want, out)
			}
			if strings.Contains(string(out), secret) {
				t.Errorf("%v: the output shows the file's secret:\n%s", tc.args, out)
			}
		})
	}
}

// TestServeUpstreamAuthDockerHubStyle (issue 13): the binary, as docker.io, pulls from a
// Docker-Hub-shaped upstream on the names /etc/hosts maps to loopback — registry.hub.test, whose
// bearer tokens come from the realm auth.hub.test — with the entry `docker login` writes under
// https://index.docker.io/v1/; the realm gets the credentials, the registry only the token, and
// the password is in no log line.
func TestServeUpstreamAuthDockerHubStyle(t *testing.T) {
	t.Parallel()
	runtimetest.RequireLoopbackName(t, "registry.hub.test")
	runtimetest.RequireLoopbackName(t, "auth.hub.test")
	const user, password, token = "hubuser", "hub-pa55word-never-logged", "token-for-hubuser"
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/private", "v1", mirrortest.Image(t, 4096, 2, "linux/amd64"))

	var (
		mu         sync.Mutex
		realmAuths []string
	)
	realm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		realmAuths = append(realmAuths, r.Header.Get("Authorization"))
		mu.Unlock()
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password || r.URL.Query().Get("service") != "registry.hub.test" {
			http.Error(w, `{"details":"incorrect username or password"}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"token":"`+token+`"}`)
	}))
	t.Cleanup(realm.Close)
	_, realmPort, _ := net.SplitHostPort(realm.Listener.Addr().String())
	up.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+token {
				w.Header().Set("WWW-Authenticate", `Bearer realm="http://auth.hub.test:`+realmPort+`/token",service="registry.hub.test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	_, upPort, _ := net.SplitHostPort(up.Addr)

	dir := t.TempDir()
	entry := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	config := writeFile(t, dir, "config.json", `{"auths":{"https://index.docker.io/v1/":{"auth":"`+entry+`"}}}`)
	listen := nodecachetest.FreeAddr(t)
	logs := startServe(t, nil, nil, "http://"+listen+"/readyz",
		"--listen", listen, "--root", filepath.Join(dir, "root"), "--log-level", "debug",
		"--upstream", "docker.io=http://registry.hub.test:"+upPort,
		"--upstream-auth", "docker.io="+config)

	if _, err := nodecachetest.PullValid(t.Context(), listen+"/team/private:v1"); err != nil { // docker.io: the default upstream
		t.Fatal(err)
	}
	mu.Lock()
	auths := append([]string(nil), realmAuths...)
	mu.Unlock()
	if len(auths) == 0 || auths[0] != "Basic "+entry {
		t.Errorf("the realm got %q, want the configured credentials", auths)
	}
	for _, r := range up.Requests() {
		if strings.HasPrefix(r.Authorization, "Basic") {
			t.Errorf("the registry got the credentials themselves: %s %s", r.Method, r.Path)
		}
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, password) || strings.Contains(l, entry) {
			t.Errorf("log line carries the password: %s", l)
		}
	}
}
