package configure

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// TestContainerdDryRun: a dry run plans, renders the diff and the report as text and JSON, and
// writes nothing.
func TestContainerdDryRun(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cfg := filepath.Join(root, "etc/containerd/config.toml")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("version = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Containerd(t.Context(), ContainerdOptions{
		Common:  Common{Mirror: "http://10.0.0.5:5000", Upstreams: []string{"docker.io"}, HostRoot: root, DryRun: true},
		Version: "1.7.27", DialTimeout: containerd.DefaultDialTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	var text, js bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"+++ b/etc/containerd/certs.d/docker.io/hosts.toml", "would create /etc/containerd/certs.d/docker.io/hosts.toml",
		"would update /etc/containerd/config.toml", "restart_required: true\n"} {
		if !strings.Contains(text.String(), s) {
			t.Errorf("text lacks %q:\n%s", s, text.String())
		}
	}
	if strings.Contains(text.String(), "restart containerd (or cycle the node)") {
		t.Errorf("a dry run tells to restart:\n%s", text.String())
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct {
		DryRun          bool   `json:"dry_run"`
		Diff            string `json:"diff"`
		RestartRequired bool   `json:"restart_required"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || !got.DryRun || !got.RestartRequired || !strings.HasPrefix(got.Diff, "--- ") {
		t.Fatalf("json %+v (%v):\n%s", got, err, js.String())
	}
	if _, err := os.Stat(filepath.Join(root, "etc/containerd/certs.d")); !os.IsNotExist(err) {
		t.Fatalf("dry run wrote the hosts directory: %v", err)
	}
	// Once applied, a dry run says the files are unchanged, not "would unchanged" (newuser3 item 15).
	opts := ContainerdOptions{Common: Common{Mirror: "http://10.0.0.5:5000", Upstreams: []string{"docker.io"}, HostRoot: root}, Version: "1.7.27", DialTimeout: containerd.DefaultDialTimeout}
	if _, err := Containerd(t.Context(), opts); err != nil {
		t.Fatal(err)
	}
	opts.DryRun = true
	if rep, err = Containerd(t.Context(), opts); err != nil {
		t.Fatal(err)
	}
	text.Reset()
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if s := text.String(); !strings.Contains(s, "\nunchanged /etc/containerd/certs.d/docker.io/hosts.toml\n") || strings.Contains(s, "would unchanged") {
		t.Errorf("dry run on a configured host:\n%s", s)
	}
}

// TestRefusals: input errors wrap bootstrap.ErrRefused (exit 2) and name the flag.
func TestRefusals(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	good := Common{Mirror: "http://10.0.0.5:5000", HostRoot: root}
	t.Cleanup(func() { // after every subtest
		if ents, _ := os.ReadDir(root); len(ents) != 0 {
			t.Errorf("refusals wrote %v", ents)
		}
	})
	for _, tc := range []struct {
		name string
		run  func() error
		want string
	}{
		{"no mirror", func() error {
			_, err := Containerd(t.Context(), ContainerdOptions{Common: Common{HostRoot: root}, Version: "2.4.2"})
			return err
		}, "--mirror"},
		{"containerd version", func() error {
			_, err := Containerd(t.Context(), ContainerdOptions{Common: good, Version: "latest", DialTimeout: containerd.DefaultDialTimeout})
			return err
		}, `--containerd-version: version "latest": want MAJOR.MINOR[.PATCH]`},
		{"dial timeout", func() error {
			_, err := Containerd(t.Context(), ContainerdOptions{Common: good, Version: "2.4.2", DialTimeout: -time.Second})
			return err
		}, `--dial-timeout -1s: want a positive duration such as 2s, 500ms or 1m (default 2s)`},
		{"dial timeout zero", func() error {
			_, err := Containerd(t.Context(), ContainerdOptions{Common: good, Version: "2.4.2"})
			return err
		}, `--dial-timeout 0s: want a positive duration`},
		{"crio version", func() error {
			_, err := Crio(t.Context(), CrioOptions{Common: good, Version: "x"})
			return err
		}, `--crio-version: version "x": want MAJOR.MINOR[.PATCH], e.g. 1.34.1`},
		{"containerd version with junk", func() error {
			_, err := Containerd(t.Context(), ContainerdOptions{Common: good, Version: "2.0.junk", DialTimeout: containerd.DefaultDialTimeout})
			return err
		}, `--containerd-version: version "2.0.junk": want MAJOR.MINOR[.PATCH], e.g. 2.4.2`},
		{"host root", func() error {
			c := good
			c.HostRoot = filepath.Join(root, "missing")
			_, err := Crio(t.Context(), CrioOptions{Common: c, Version: "1.31.0"})
			return err
		}, "--host-root"},
		{"mirror CA for http", func() error {
			c := good
			c.MirrorCA = "/etc/ca.pem"
			_, err := Crio(t.Context(), CrioOptions{Common: c, Version: "1.31.0"})
			return err
		}, "--mirror-ca is for an https mirror"},
		{"talos dry run without -o", func() error {
			c := good
			c.DryRun = true
			_, err := Talos(t.Context(), TalosOptions{Common: c})
			return err
		}, "--dry-run needs -o FILE"},
		{"talos machine config without remove", func() error {
			_, err := Talos(t.Context(), TalosOptions{Common: good, MachineConfig: "/x.yaml"})
			return err
		}, "--machine-config is for --remove"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.run()
			if !Refused(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v; want a refusal saying %q", err, tc.want)
			}
		})
	}
}
