package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
)

// TestTalosExamplesAreCurrent: examples/talos holds exactly what gen talos prints today.
func TestTalosExamplesAreCurrent(t *testing.T) {
	t.Parallel()
	for file, args := range map[string][]string{
		"registry-mirrors.yaml":        {"--mirror", "http://10.0.0.5:5000"},
		"registry-mirrors-v1.11.yaml":  {"--mirror", "http://10.0.0.5:5000", "--talos-version", "v1.11.5"},
		"registry-mirrors-agent.yaml":  {"--mirror", "http://127.0.0.1:5000"},
		"remove-registry-mirrors.yaml": {"--mirror", "http://10.0.0.5:5000", "--remove"},
	} {
		want, err := os.ReadFile(filepath.Join("..", "..", "examples", "talos", file))
		if err != nil {
			t.Fatal(err)
		}
		got, err := exec.Command(binary, append([]string{"gen", "talos"}, args...)...).Output()
		if err != nil {
			t.Fatalf("gen talos %v: %v", args, err)
		}
		if string(got) != string(want) {
			t.Errorf("examples/talos/%s is not what `nodecache gen talos %v` prints now:\n%s", file, args, got)
		}
	}
}

// TestStopGraceInManifests: every manifest that runs serve or the agent (the chart's templates,
// examples/kubernetes) gives its pods terminationGracePeriodSeconds, and the systemd unit
// TimeoutStopSec, of exactly mirror.StopGrace in seconds (330: the 5 minutes in-flight
// responses get after SIGTERM, then 30 s for fills); no other grace period appears. Shorter, the
// kubelet or systemd kills a response still sending a blob (issue 26: the agent had the
// default 30 s); a changed default fails here until the manifests follow it.
func TestStopGraceInManifests(t *testing.T) {
	t.Parallel()
	want := strconv.Itoa(int(mirror.StopGrace / time.Second))
	repo := filepath.Join("..", "..")
	grace := regexp.MustCompile(`(?m)^\s*terminationGracePeriodSeconds:\s*(\S+)`)
	runs := regexp.MustCompile(`(?m)^\s*- (agent|serve)\s*$`) // the first container argument
	var files []string
	for _, dir := range []string{"charts/nodecache/templates", "examples/kubernetes"} {
		err := filepath.WalkDir(filepath.Join(repo, dir), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	servers := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got := grace.FindAllStringSubmatch(string(b), -1)
		for _, m := range got {
			if m[1] != want {
				t.Errorf("%s: terminationGracePeriodSeconds %s, want %s (mirror.StopGrace)", f, m[1], want)
			}
		}
		if runs.Match(b) {
			servers++
			if len(got) == 0 {
				t.Errorf("%s runs serve or the agent without terminationGracePeriodSeconds: %s (mirror.StopGrace)", f, want)
			}
		}
	}
	if servers < 6 {
		t.Errorf("found serve or the agent in %d manifests, want at least 6 (chart agent and shared, examples agent, shared, regional deployment and agent): the pattern no longer matches", servers)
	}
	unit, err := os.ReadFile(filepath.Join(repo, "examples", "baremetal", "nodecache.service"))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\S+)$`).FindSubmatch(unit); m == nil || string(m[1]) != want {
		t.Errorf("examples/baremetal/nodecache.service: TimeoutStopSec %q, want %s (mirror.StopGrace)", m, want)
	}
}
