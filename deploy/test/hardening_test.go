package test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// stopGraceSeconds is nodecache's mirror.StopGrace in seconds: the 5 minutes in-flight responses
// get after SIGTERM, then 30 s for blob fills. cmd/nodecache TestStopGraceInManifests ties the
// manifests' number to the constant; this module does not import nodecache.
const stopGraceSeconds = 330

// TestChartHardening (issue 26): every workload of every chart value set and every kustomize
// build — the agent, shared, cleanup DaemonSet and warm Job pods — has no service account token
// (nodecache uses no Kubernetes API), the RuntimeDefault seccomp profile, and in every container
// a read-only root file system without privilege escalation. Where nodecache writes outside its
// mounts it gets its own: /tmp (gen's private copies of the files it checks) for the agent and
// gen. Where serve runs (agent, shared) the pods wait stopGraceSeconds after SIGTERM, serve's
// drain, instead of the default 30 s.
func TestChartHardening(t *testing.T) {
	t.Parallel()
	workloads := 0
	for src, objs := range allManifests(t) {
		for key, tpl := range podTemplates(objs) {
			workloads++
			where := src + ": " + key
			spec := tpl.Spec
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Errorf("%s: automountServiceAccountToken is not false", where)
			}
			if sc := spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: the pod's seccompProfile is not RuntimeDefault", where)
			}
			serves := false
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				cwhere := where + "/" + c.Name
				sc := c.SecurityContext
				if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: readOnlyRootFilesystem is not true", cwhere)
				}
				if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: allowPrivilegeEscalation is not false", cwhere)
				}
				if !nodecacheImage.MatchString(c.Image) || len(c.Args) == 0 {
					continue
				}
				switch c.Args[0] {
				case "agent", "serve":
					serves = true
				}
				switch c.Args[0] {
				case "agent", "gen":
					if !mountedWritable(spec, c, "/tmp") {
						t.Errorf("%s: nodecache %s writes temporary files and /tmp is no writable volume", cwhere, c.Args[0])
					}
				}
				for _, a := range c.Args {
					if root, ok := strings.CutPrefix(a, "--root="); ok && !mountedWritable(spec, c, root) {
						t.Errorf("%s: --root %s is no writable volume", cwhere, root)
					}
				}
			}
			grace := spec.TerminationGracePeriodSeconds
			switch {
			case serves && (grace == nil || *grace != stopGraceSeconds):
				t.Errorf("%s runs serve: terminationGracePeriodSeconds %v, want %d (serve's drain)", where, deref(grace), stopGraceSeconds)
			case !serves && grace != nil:
				t.Errorf("%s: terminationGracePeriodSeconds %d for a pod that serves nothing", where, *grace)
			}
		}
	}
	if workloads < 40 {
		t.Fatalf("checked only %d workloads", workloads)
	}
}

// mountedWritable reports whether path is, or is under, a volume mounted read-write into c.
func mountedWritable(spec corev1.PodSpec, c corev1.Container, path string) bool {
	for _, m := range c.VolumeMounts {
		if m.ReadOnly || (path != m.MountPath && !strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && (v.EmptyDir != nil || v.HostPath != nil || v.PersistentVolumeClaim != nil) {
				return true
			}
		}
	}
	return false
}

func deref[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}

// TestAgentReadOnlyRoot (issue 26): the agent container exactly as the chart renders it (its
// arguments and environment, and its volume mounts: the host's / and the cache as host paths,
// /tmp as an emptyDir) runs with a read-only root file system, as the kubelet would start it:
// a private mount namespace, the mounts bound into an image-like root, the root remounted
// read-only, chroot. The host is a temporary directory holding a containerd and a CRI-O
// configuration with site files to adopt, which makes gen take its private copies (the paths
// that write to /tmp). The agent serves /healthz, configures both runtimes without a write
// refused, and stops cleanly on SIGTERM. Without the /tmp volume the same agent logs
// "read-only file system" and leaves the site's hosts.toml as it was: the check can fail, and
// /tmp is the writable path the agent needs beyond its mounts.
func TestAgentReadOnlyRoot(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("a mount namespace and bind mounts need root, and CI=true runs as root (euid %d)", os.Geteuid())
		}
		t.Skipf("a mount namespace and bind mounts need root (euid %d; CI runs as root)", os.Geteuid())
	}
	unshare := needTool(t, "unshare", "util-linux")
	chroot := needTool(t, "chroot", "coreutils")
	for _, tc := range []struct {
		name    string
		dropTmp bool
	}{{"as rendered", false}, {"without the /tmp volume", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, port, _ := net.SplitHostPort(freePort(t))
			_, metricsPort, _ := net.SplitHostPort(freePort(t))
			objs := render(t, "nodecache", vals(t, fmt.Sprintf(`
port: %s
metrics: {port: %s}
extraArgs: ["--containerd-version=1.7.27", "--crio-version=1.34.0", "--no-reload"]
`, port, metricsPort)), false)
			var agent corev1.Container
			var pod corev1.PodSpec
			for key, tpl := range podTemplates(objs) {
				if key == "DaemonSet/nodecache" {
					pod, agent = tpl.Spec, tpl.Spec.Containers[0]
				}
			}
			if agent.Name != "agent" {
				t.Fatalf("no agent container rendered: %+v", agent)
			}
			if tc.dropTmp {
				agent.VolumeMounts = slices.DeleteFunc(agent.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/tmp" })
			}

			dir := t.TempDir()
			host, root := filepath.Join(dir, "host"), filepath.Join(dir, "root")
			siteHosts := "server = \"https://registry-1.docker.io\"\n\n[host.\"https://site-mirror.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
			for p, body := range map[string]string{
				"etc/containerd/config.toml":                  "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
				"etc/containerd/certs.d/docker.io/hosts.toml": siteHosts,
				"etc/crio/crio.conf":                          "[crio]\n",
				"etc/containers/registries.conf":              "unqualified-search-registries = [\"docker.io\"]\n",
				"etc/containers/registries.conf.d/site.conf":  "[[registry]]\nlocation = \"quay.io\"\n",
			} {
				writeFile(t, filepath.Join(host, p), body)
			}
			// The image's own tree (distroless static): the binary, its users (runc sets HOME from
			// them, containers/image reads it), /tmp, and the /proc and /dev mount points.
			for _, d := range []string{"usr/local/bin", "tmp", "proc", "dev", "var/lib/nodecache"} {
				if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			writeFile(t, filepath.Join(root, "usr/local/bin/nodecache"), "")
			writeFile(t, filepath.Join(root, "etc/passwd"), "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
			script := []string{"set -e",
				fmt.Sprintf("mount --bind %q %q", root, root),
				fmt.Sprintf("mount --bind %q %q", binary, filepath.Join(root, "usr/local/bin/nodecache")),
				fmt.Sprintf("mount -t proc proc %q", filepath.Join(root, "proc")),
				fmt.Sprintf("mount --rbind /dev %q", filepath.Join(root, "dev")),
			}
			for _, m := range agent.VolumeMounts {
				target := filepath.Join(root, m.MountPath)
				if err := os.MkdirAll(target, 0o755); err != nil {
					t.Fatal(err)
				}
				i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
				switch v := pod.Volumes[i]; {
				case v.HostPath != nil:
					src := filepath.Join(host, v.HostPath.Path)
					if err := os.MkdirAll(src, 0o755); err != nil { // DirectoryOrCreate; / exists
						t.Fatal(err)
					}
					script = append(script, fmt.Sprintf("mount --bind %q %q", src, target))
				case v.EmptyDir != nil:
					script = append(script, fmt.Sprintf("mount -t tmpfs -o size=16m tmpfs %q", target))
				default:
					t.Fatalf("volume %s: neither a host path nor an emptyDir", v.Name)
				}
			}
			args := make([]string, len(agent.Args))
			for i, a := range agent.Args {
				args[i] = strconv.Quote(strings.ReplaceAll(a, "$(HOST_IP)", "127.0.0.1"))
			}
			script = append(script, fmt.Sprintf("mount -o remount,bind,ro %q", root),
				fmt.Sprintf("exec %q %q /usr/local/bin/nodecache %s", chroot, root, strings.Join(args, " ")))

			var log syncBuffer
			cmd := exec.Command(unshare, "--mount", "--propagation", "private", "sh", "-c", strings.Join(script, "\n"))
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"} // runc: HOME of runAsUser 0
			for _, e := range agent.Env {
				if e.ValueFrom == nil {
					cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
				}
			}
			cmd.Stdout, cmd.Stderr = &log, &log
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var waitErr error
			exited := make(chan struct{})
			go func() { waitErr = cmd.Wait(); close(exited) }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			configured := func() bool {
				return strings.Count(log.String(), `"message":"gen c`) >= 2 // gen containerd and gen crio
			}
			deadline := time.Now().Add(30 * time.Second)
			for !configured() && time.Now().Before(deadline) {
				select {
				case <-exited:
					t.Fatalf("the agent exited: %v\n%s", waitErr, log.String())
				case <-time.After(100 * time.Millisecond):
				}
			}
			if !configured() {
				t.Fatalf("the agent did not log both configure passes in 30 s:\n%s", log.String())
			}
			resp, err := http.Get("http://127.0.0.1:" + port + "/healthz")
			if err != nil {
				t.Fatalf("/healthz: %v\n%s", err, log.String())
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("/healthz: %s", resp.Status)
			}
			hosts, err := os.ReadFile(filepath.Join(host, "etc/containerd/certs.d/docker.io/hosts.toml"))
			if err != nil {
				t.Fatal(err)
			}
			adopted := strings.Contains(string(hosts), "127.0.0.1:"+port)
			readOnly := strings.Contains(log.String(), "read-only file system")
			if tc.dropTmp {
				if !readOnly || adopted {
					t.Errorf("without /tmp: logged read-only file system %v (want true), the site's hosts.toml adopted %v (want false):\n%s", readOnly, adopted, log.String())
				}
				return
			}
			if readOnly || !adopted || strings.Contains(log.String(), `"level":"error"`) {
				t.Errorf("logged read-only file system %v (want false), the site's hosts.toml adopted %v (want true), or an error:\n%s", readOnly, adopted, log.String())
			}
			if _, err := os.Stat(filepath.Join(host, "etc/containers/registries.conf.d/90-nodecache.conf")); err != nil {
				t.Errorf("CRI-O's drop-in: %v", err)
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-exited:
				if waitErr != nil {
					t.Errorf("after SIGTERM: %v\n%s", waitErr, log.String())
				}
			case <-time.After(30 * time.Second):
				t.Errorf("still running 30 s after SIGTERM:\n%s", log.String())
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for a process's output and the test reading it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestChartMaxSizePerMode (issue 26): the agent has its own cap, agent.maxSize, a share of the
// node's disk by default (--max-size=20%); maxSize is the shared cache's alone (no cap by
// default), and in mode=agent it is refused with a sentence naming agent.maxSize instead of
// being ignored.
func TestChartMaxSizePerMode(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	maxSize := func(values string) []string {
		t.Helper()
		objs, _, err := renderValues(c, "nodecache", "nodecache", vals(t, values), false)
		if err != nil {
			t.Fatalf("%s: %v", values, err)
		}
		var got []string
		for _, ctr := range containers(objs) {
			for _, a := range ctr.Args {
				if strings.HasPrefix(a, "--max-size") {
					got = append(got, a)
				}
			}
		}
		return got
	}
	for _, tc := range []struct {
		values string
		want   []string
	}{
		{`{}`, []string{"--max-size=20%"}},
		{`{agent: {maxSize: 30GiB}}`, []string{"--max-size=30GiB"}},
		{`{agent: {maxSize: ""}}`, nil},
		{`{mode: shared}`, nil},
		{`{mode: shared, maxSize: 180GiB}`, []string{"--max-size=180GiB"}},
		{`{mode: shared, maxSize: 90%, agent: {maxSize: 5%}}`, []string{"--max-size=90%"}},
		{`{mode: cleanup, maxSize: 30GiB}`, nil},
	} {
		if got := maxSize(tc.values); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.values, got, tc.want)
		}
	}
	_, _, err := renderValues(c, "nodecache", "nodecache", vals(t, `{maxSize: 30GiB}`), false)
	if err == nil || !strings.Contains(err.Error(), `maxSize "30GiB" is the shared cache's cap (mode=shared); the agent's is agent.maxSize`) ||
		!strings.Contains(err.Error(), "--set agent.maxSize=30GiB") {
		t.Errorf("maxSize in mode=agent: %v, want a refusal naming agent.maxSize", err)
	}
	// Every refused value at once, each on its line: not one round trip per mistake.
	_, _, err = renderValues(c, "nodecache", "nodecache", vals(t, `{maxSize: 30GB, upstreams: [ghcr.io/x]}`), false)
	for _, want := range []string{"values refused:\nupstreams: --upstream: registry name \"ghcr.io/x\"",
		"\nmaxSize: --max-size \"30GB\": decimal and short units are not accepted; did you mean 30GiB?",
		"\nmaxSize \"30GB\" is the shared cache's cap"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("two mistakes: %v\nwant it to say %q", err, want)
		}
	}
}
