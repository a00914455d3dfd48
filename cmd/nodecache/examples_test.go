package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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
