package containerd

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestSetString(t *testing.T) {
	t.Parallel()
	images := []string{"plugins", PluginImages, "registry"}
	near := images[:2]
	cases := []struct {
		name, in, want, err string
	}{
		{
			name: "replace keeps literal quotes",
			in:   "[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = '/a:/b' # comment\n",
			want: "[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = '/x' # comment\n",
		},
		{
			name: "insert after header with the table's indentation",
			in:   "[plugins.\"io.containerd.cri.v1.images\".registry]\n    [plugins.\"io.containerd.cri.v1.images\".registry.headers]\n    X = [\"y\"]\n",
			want: "[plugins.\"io.containerd.cri.v1.images\".registry]\nconfig_path = \"/x\"\n    [plugins.\"io.containerd.cri.v1.images\".registry.headers]\n    X = [\"y\"]\n",
		},
		{
			name: "new table after the plugin's last table, quoting like the file",
			in:   "version = 3\n[plugins.'io.containerd.cri.v1.images']\nsnapshotter = 'native'\n\n[grpc]\naddress = '/run/x.sock'\n",
			want: "version = 3\n[plugins.'io.containerd.cri.v1.images']\nsnapshotter = 'native'\n\n[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = \"/x\"\n\n[grpc]\naddress = '/run/x.sock'\n",
		},
		{
			name: "no plugin table: appended, newline added",
			in:   "version = 3",
			want: "version = 3\n\n[plugins.\"io.containerd.cri.v1.images\".registry]\nconfig_path = \"/x\"\n",
		},
		{
			name: "dotted key",
			in:   "[plugins.\"io.containerd.cri.v1.images\"]\nregistry.config_path = \"\"\n",
			want: "[plugins.\"io.containerd.cri.v1.images\"]\nregistry.config_path = \"/x\"\n",
		},
		{
			name: "inline table refused",
			in:   "[plugins.\"io.containerd.cri.v1.images\"]\nregistry = { config_path = \"\" }\n",
			err:  "inline table",
		},
		{
			name: "not a string refused",
			in:   "[plugins.\"io.containerd.cri.v1.images\".registry]\nconfig_path = 3\n",
			err:  "not a string",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, err := parseTOMLDoc([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			err = d.setString(images, "config_path", "/x", near)
			var out []byte
			if err == nil {
				out, err = d.bytes()
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("want error %q, got %v", tc.err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", out, tc.want)
			}
		})
	}
}

func TestDeleteTree(t *testing.T) {
	t.Parallel()
	in := `[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = ""
  # mirrors below
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors]
    [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
      endpoint = ["https://a",
                  "https://b"]

  # keep me
  [plugins."io.containerd.grpc.v1.cri".registry.configs."x.io".auth]
    username = "u"
  [plugins."io.containerd.grpc.v1.cri".registry.configs."x.io".tls]
    ca_file = "/ca"
[other]
registry.mirrors = 1
`
	want := `[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = ""
  # mirrors below

  # keep me
  [plugins."io.containerd.grpc.v1.cri".registry.configs."x.io".auth]
    username = "u"
[other]
registry.mirrors = 1
`
	d, err := parseTOMLDoc([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	reg := []string{"plugins", PluginCRIv1, "registry"}
	if err := d.deleteTree(append(reg, "mirrors")); err != nil {
		t.Fatal(err)
	}
	if err := d.deleteTree(append(reg, "configs", "x.io", "tls")); err != nil {
		t.Fatal(err)
	}
	out, err := d.bytes()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
}

// FuzzSetConfigPath: for any TOML document, setting config_path either fails cleanly or yields a
// document that parses and carries the value at the registry path, with every other top-level
// key unchanged.
func FuzzSetConfigPath(f *testing.F) {
	_, file, _, _ := runtime.Caller(0)
	if ents, err := os.ReadDir(filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "shared", "fixtures", "containerd", "config")); err == nil {
		for _, e := range ents {
			if b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "shared", "fixtures", "containerd", "config", e.Name())); err == nil {
				f.Add(b, "/etc/containerd/certs.d")
			}
		}
	}
	f.Add([]byte("version = 2\n[plugins.'io.containerd.grpc.v1.cri'.registry]\nconfig_path = 'x'\n"), "a'b\"c\\")
	f.Add([]byte("a.b.c = 1\n[[plugins.x]]\n"), "\x01")
	f.Fuzz(func(t *testing.T, data []byte, value string) {
		var before map[string]any
		if toml.Unmarshal(data, &before) != nil {
			return
		}
		d, err := parseTOMLDoc(data)
		if err != nil {
			t.Fatalf("go-toml decodes it but the unstable parser does not: %v", err)
		}
		table := []string{"plugins", PluginCRIv1, "registry"}
		if d.setString(table, "config_path", value, table[:2]) != nil {
			return
		}
		out, err := d.bytes()
		if err != nil {
			return // refused: the edit would not parse
		}
		var after map[string]any
		if err := toml.Unmarshal(out, &after); err != nil {
			t.Fatalf("edited document does not parse: %v", err)
		}
		got, _ := asMap(asMap(asMap(after["plugins"])[PluginCRIv1])["registry"])["config_path"].(string)
		if got != value {
			t.Fatalf("config_path = %q, want %q\n%s", got, value, out)
		}
		for k, v := range before {
			if k == "plugins" {
				continue
			}
			if b1, _ := toml.Marshal(map[string]any{k: v}); true {
				b2, _ := toml.Marshal(map[string]any{k: after[k]})
				if string(b1) != string(b2) {
					t.Fatalf("key %q changed", k)
				}
			}
		}
	})
}
