package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/warm"
)

// TestWarmRefusedSendsNothing: every refused input exits 2, names the value, and the mirror
// (a real registry here) receives no request at all.
func TestWarmRefusedSendsNothing(t *testing.T) {
	t.Parallel()
	mirror := newSilentMirror(t, "refused input")
	url := mirror.URL.String()
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"newline in tag", []string{"--mirror", url, "ghcr.io/siderolabs/kubelet:v1.35.6\nid"}, `"ghcr.io/siderolabs/kubelet:v1.35.6\nid"`},
		{"space", []string{"--mirror", url, "nginx latest"}, `"nginx latest"`},
		{"semicolon", []string{"--mirror", url, "nginx;reboot"}, "shell metacharacter"},
		{"command substitution", []string{"--mirror", url, "nginx:$(id)"}, "shell metacharacter"},
		{"backtick", []string{"--mirror", url, "nginx:`id`"}, "shell metacharacter"},
		{"pipe", []string{"--mirror", url, "nginx|sh"}, "shell metacharacter"},
		{"control", []string{"--mirror", url, "nginx\x1b"}, "control character"},
		{"tab", []string{"--mirror", url, "nginx\t"}, "control character"},
		{"grammar", []string{"--mirror", url, "nginx::1"}, "grammar"},
		{"upper case", []string{"--mirror", url, "Nginx"}, "lowercase"},
		{"one good one bad", []string{"--mirror", url, "nginx", "alpine;id"}, `"alpine;id"`},
		{"flag after image", []string{"--mirror", url, "nginx", "--talos"}, "flags go before IMAGE"},
		{"no image", []string{"--mirror", url}, "no IMAGE"},
		{"no mirror", []string{"nginx"}, "--mirror"},
		{"mirror with path", []string{"--mirror", url + "/v2/ghcr.io", "nginx"}, `path "/v2/ghcr.io" is not accepted`},
		{"mirror scheme", []string{"--mirror", "ftp://" + mirror.Addr, "nginx"}, "scheme"},
		{"platform", []string{"--mirror", url, "--platform", "linux/amd64;id", "nginx"}, "--platform"},
		{"platform without arch", []string{"--mirror", url, "--platform", "amd64", "nginx"}, "--platform"},
		{"platform match", []string{"--mirror", url, "--platform-match", "exact", "nginx"}, `--platform-match "exact" refused: want transfer`},
		{"routing", []string{"--mirror", url, "--routing", "dns", "nginx"}, "--routing"},
		{"output", []string{"--mirror", url, "--output", "yaml", "nginx"}, "--output"},
		{"kubernetes version without talos", []string{"--mirror", url, "--kubernetes-version", "v1.35.6", "nginx"}, "only with --talos"},
		{"kubernetes version newline", []string{"--mirror", url, "--talos", "--kubernetes-version", "v1.35.6\nid"}, "--kubernetes-version"},
		{"concurrency", []string{"--mirror", url, "--concurrency", "0", "nginx"}, "--concurrency"},
		{"retries", []string{"--mirror", url, "--retries", "-1", "nginx"}, "--retries"},
		{"unknown flag", []string{"--mirror", url, "--bogus", "nginx"}, "bogus"},
		{"wait not a duration", []string{"--mirror", url, "--wait", "abc", "nginx"}, `--wait "abc": want a duration such as 500ms, 30s`},
		{"blob timeout not a duration", []string{"--mirror", url, "--blob-timeout=ten", "nginx"}, `--blob-timeout "ten": want a duration`},
		{"deadline not a duration", []string{"--mirror", url, "--deadline", "1 hour", "nginx"}, `--deadline "1 hour": want a duration`},
		{"concurrency not a number", []string{"--mirror", url, "--concurrency", "four", "nginx"}, `--concurrency "four": want a whole number`},
		{"talos not a boolean", []string{"--mirror", url, "--talos=maybe"}, `--talos "maybe": want true or false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runApp(t, append([]string{"warm"}, tc.args...)...)
			if code != exitUsage {
				t.Fatalf("exit %d, want 2; stdout %q stderr %q", code, stdout, stderr)
			}
			if !strings.Contains(stderr, tc.says) {
				t.Errorf("stderr %q does not name %q", stderr, tc.says)
			}
		})
	}
}

// TestWarmExitCodes runs the warm command against a stock-free setup: nodecache's mirror is not
// needed here, a plain registry serves as the mirror (it holds the images itself, so every GET
// answers like a warm cache).
func TestWarmExitCodes(t *testing.T) {
	t.Parallel()
	reg := mirrortest.NewRegistry(t)
	good := mirrortest.Image(t, 8<<10, 1, "linux/amd64")
	bad := mirrortest.Image(t, 8<<10, 2, "linux/amd64")
	reg.PushImage(t, "warm/good", "v1", good)
	reg.PushImage(t, "warm/bad", "v1", bad)
	mf, _ := bad.Manifest()
	broken := mf.Layers[1].Digest.String()
	reg.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, broken) {
				http.Error(w, "injected", http.StatusServiceUnavailable)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	// The registry is reached as the mirror; the reference names it as the upstream too.
	goodRef, badRef := reg.Addr+"/warm/good:v1", reg.Addr+"/warm/bad:v1"
	base := []string{"warm", "--mirror", reg.URL.String(), "--platform", "linux/amd64", "--retries", "1", "--wait", "5s"}

	t.Run("warm json", func(t *testing.T) {
		t.Parallel()
		var rep warm.Report
		stderr := runAppJSON(t, &rep, append(base, "--output", "json", goodRef)...)
		if !rep.Warm || len(rep.Images) != 1 || rep.Images[0].BlobsFetched != 2 || rep.Images[0].Reference != goodRef {
			t.Errorf("report %+v", rep)
		}
		if !strings.Contains(stderr, "fetched ") {
			t.Errorf("no per-blob progress lines on a non-terminal stderr: %q", stderr)
		}
	})
	t.Run("one image not warm", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := runApp(t, append(base, goodRef, badRef)...)
		if code != exitNegative {
			t.Fatalf("exit %d, want 1; stdout %s stderr %s", code, stdout, stderr)
		}
		if !strings.Contains(stdout, "NOT WARM "+badRef) || !strings.Contains(stdout, "WARM     "+goodRef) {
			t.Errorf("stdout does not name the image not warm:\n%s", stdout)
		}
	})
	t.Run("single manifest of another platform", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := runApp(t, "warm", "--mirror", reg.URL.String(), "--platform", "linux/arm64", "--retries", "1", "--wait", "5s", goodRef)
		if code != exitNegative || !strings.Contains(stdout, "image is linux/amd64, not linux/arm64") {
			t.Fatalf("exit %d, want 1 naming both platforms; stdout %s stderr %s", code, stdout, stderr)
		}
	})
	t.Run("mirror unreachable", func(t *testing.T) {
		t.Parallel()
		down := mirrortest.NewStoppedRegistry(t, "127.0.0.1:0")
		code, stdout, stderr := runApp(t, "warm", "--mirror", down.URL.String(), "--wait", "0", goodRef)
		if code != exitNegative || !strings.Contains(stdout, "gave no registry answer") {
			t.Fatalf("exit %d, want 1 naming the mirror; stdout %s stderr %s", code, stdout, stderr)
		}
	})
}

// TestWarmProcessExitCodes checks the exit codes of the real process (the binary TestMain
// builds): 2 for a refused reference, 1 for a mirror that never answers within --wait.
func TestWarmProcessExitCodes(t *testing.T) {
	t.Parallel()
	down := mirrortest.NewStoppedRegistry(t, "127.0.0.1:0")
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"refused reference", []string{"warm", "--mirror", down.URL.String(), "nginx\nid"}, exitUsage},
		{"mirror down", []string{"warm", "--mirror", down.URL.String(), "--wait", "1s", "nginx"}, exitNegative},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), binary, tc.args...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("exit %v, want %d; output:\n%s", err, tc.code, out)
			}
		})
	}
}

// TestWarmJobExample checks examples/kubernetes/warm-job.yaml: bounded (backoffLimit,
// activeDeadlineSeconds above warm's --deadline, ttlSecondsAfterFinished above that), the
// restricted Pod Security Standard, no service account token; and runs its exact arguments
// (only --mirror pointed at a local registry that holds every image it names) to exit 0.
func TestWarmJobExample(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "kubernetes", "warm-job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type container struct {
		Args            []string `yaml:"args"`
		SecurityContext struct {
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
			ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
			Privileged               bool  `yaml:"privileged"`
			Capabilities             struct {
				Drop []string `yaml:"drop"`
				Add  []string `yaml:"add"`
			} `yaml:"capabilities"`
		} `yaml:"securityContext"`
	}
	type doc struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name      string            `yaml:"name"`
			Namespace string            `yaml:"namespace"`
			Labels    map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			BackoffLimit            *int `yaml:"backoffLimit"`
			ActiveDeadlineSeconds   int  `yaml:"activeDeadlineSeconds"`
			TTLSecondsAfterFinished int  `yaml:"ttlSecondsAfterFinished"`
			Template                struct {
				Spec struct {
					RestartPolicy                string      `yaml:"restartPolicy"`
					AutomountServiceAccountToken *bool       `yaml:"automountServiceAccountToken"`
					HostNetwork                  bool        `yaml:"hostNetwork"`
					HostPID                      bool        `yaml:"hostPID"`
					Volumes                      []any       `yaml:"volumes"`
					Containers                   []container `yaml:"containers"`
					SecurityContext              struct {
						RunAsNonRoot   *bool `yaml:"runAsNonRoot"`
						RunAsUser      int   `yaml:"runAsUser"`
						SeccompProfile struct {
							Type string `yaml:"type"`
						} `yaml:"seccompProfile"`
					} `yaml:"securityContext"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	docs := map[string]doc{}
	for {
		var d doc
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode: %v", err)
		}
		docs[d.Kind] = d
	}
	ns, job := docs["Namespace"], docs["Job"]
	if job.Metadata.Namespace != ns.Metadata.Name || ns.Metadata.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("the Job's namespace %q must enforce the restricted Pod Security Standard: %+v", job.Metadata.Namespace, ns.Metadata)
	}
	spec, pod := job.Spec, job.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	var deadline time.Duration
	for _, a := range ctr.Args {
		if v, ok := strings.CutPrefix(a, "--deadline="); ok {
			deadline, _ = time.ParseDuration(v)
		}
	}
	switch {
	case spec.BackoffLimit == nil || *spec.BackoffLimit < 0 || *spec.BackoffLimit > 5:
		t.Errorf("backoffLimit %v: want a small bound", spec.BackoffLimit)
	case deadline <= 0 || time.Duration(spec.ActiveDeadlineSeconds)*time.Second <= deadline:
		t.Errorf("activeDeadlineSeconds %d must exceed warm's --deadline %s", spec.ActiveDeadlineSeconds, deadline)
	case spec.TTLSecondsAfterFinished <= spec.ActiveDeadlineSeconds:
		t.Errorf("ttlSecondsAfterFinished %d must exceed activeDeadlineSeconds %d", spec.TTLSecondsAfterFinished, spec.ActiveDeadlineSeconds)
	}
	sc := ctr.SecurityContext
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken ||
		pod.HostNetwork || pod.HostPID || len(pod.Volumes) != 0 || pod.RestartPolicy != "Never" ||
		pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser == 0 ||
		pod.SecurityContext.SeccompProfile.Type != "RuntimeDefault" ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged || !sc.ReadOnlyRootFilesystem ||
		len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0 {
		t.Errorf("pod is not restricted and token-free: %+v", pod)
	}

	// Run the example's arguments against a registry that already holds every image (a plain
	// registry ignores ?ns=, like a warm single-upstream cache).
	reg := mirrortest.NewRegistry(t)
	args := append([]string(nil), ctr.Args...)
	var images []string
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "--mirror="):
			args[i] = "--mirror=" + reg.URL.String()
		case a == "--talos":
			set, err := warm.TalosJoinImages("")
			if err != nil {
				t.Fatal(err)
			}
			images = append(images, set.Images...)
		case !strings.HasPrefix(a, "-") && a != "warm":
			images = append(images, a)
		}
	}
	if len(images) < 5 {
		t.Fatalf("the example warms %v; want the Talos join set and an image", images)
	}
	for _, s := range images {
		ref, err := warm.ParseReference(s)
		if err != nil {
			t.Fatalf("example image %q: %v", s, err)
		}
		reg.PushImage(t, ref.Repository, ref.Tag, mirrortest.Image(t, 1<<10, 1, "linux/amd64"))
	}
	code, stdout, stderr := runApp(t, args...)
	if code != exitOK {
		t.Fatalf("example args exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, fmt.Sprintf("%d of %d images warm", len(images), len(images))) || !strings.Contains(stdout, "talos v1.") {
		t.Errorf("summary:\n%s", stdout)
	}
}
