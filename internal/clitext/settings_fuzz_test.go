package clitext_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
	"gopkg.in/yaml.v3"

	"github.com/nodecache/nodecache/internal/clitext"
)

// settingsDefaults are the flags of settingsProbe with their defaults.
func settingsDefaults() map[string]any {
	return map[string]any{"listen": ":5000", "root": "", "metrics-listen": "", "log-format": "json", "log-level": "info",
		"print": false, "concurrency": 4, "upstream-timeout": 30 * time.Second, "tag-ttl": 5 * time.Minute,
		"upstream": []string{"docker.io"}}
}

// settingsProbe is a command with flags of every kind, built as cmd/nodecache builds its flags
// (altsrc flags, the clitext wrappers for durations, numbers and booleans) with the names of
// serve's (so the settings example of examples/baremetal loads) and settingsDefaults' defaults,
// which a settings file must be able to replace. Its action records every flag's value in got.
func settingsProbe(got *map[string]any) (*cli.Command, cli.BeforeFunc) {
	flags := []cli.Flag{&cli.StringFlag{Name: "config"}}
	for n, v := range settingsDefaults() {
		switch v := v.(type) {
		case string:
			flags = append(flags, altsrc.NewStringFlag(&cli.StringFlag{Name: n, Value: v}))
		case bool:
			flags = append(flags, &clitext.BoolFlag{BoolFlag: altsrc.NewBoolFlag(&cli.BoolFlag{Name: n, Value: v})})
		case int:
			flags = append(flags, &clitext.IntFlag{IntFlag: altsrc.NewIntFlag(&cli.IntFlag{Name: n, Value: v})})
		case time.Duration:
			flags = append(flags, &clitext.DurationFlag{DurationFlag: altsrc.NewDurationFlag(&cli.DurationFlag{Name: n, Value: v})})
		case []string:
			flags = append(flags, altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: n, Value: cli.NewStringSlice(v...)}))
		}
	}
	cmd := &cli.Command{Name: "probe", Flags: flags}
	load := altsrc.InitInputSourceWithContext(cmd.Flags, altsrc.NewYamlSourceFromFlagFunc("config"))
	cmd.Action = func(c *cli.Context) error {
		*got = map[string]any{}
		for n, v := range settingsDefaults() {
			switch v.(type) {
			case string:
				(*got)[n] = c.String(n)
			case bool:
				(*got)[n] = c.Bool(n)
			case int:
				(*got)[n] = c.Int(n)
			case time.Duration:
				(*got)[n] = c.Duration(n)
			case []string:
				(*got)[n] = c.StringSlice(n)
			}
		}
		return nil
	}
	return cmd, func(c *cli.Context) error {
		return clitext.Settings(c, cmd, "config", "NODECACHE_FUZZ_SETTINGS_UNSET", load)
	}
}

// FuzzSettingsFile: a YAML settings file (--config FILE, docs/settings.md) is refused with a
// message naming it, or every key it holds reaches its flag with the value it says — the
// checks (CheckSettings) accept nothing the loader then reads differently or drops — and the
// flags it does not name keep their defaults. Reading never changes the file.
func FuzzSettingsFile(f *testing.F) {
	f.Add([]byte("listen: \"127.0.0.1:25010\"\nprint: true\nconcurrency: 16\nupstream-timeout: 10s\nupstream:\n  - docker.io=https://registry-1.docker.io\n  - ghcr.io=https://ghcr.io\n"))
	f.Add([]byte("lsiten: \":5000\"\n"))
	f.Add([]byte("upstream-timeout: abc\nconcurrency: \"4\"\nprint: yes\nupstream: [docker.io, 5]\n"))
	f.Add([]byte("listen: \"\"\nconcurrency: 0\nupstream: []\nupstream-timeout: 0s\n"))
	f.Add([]byte("listen: ~\n"))
	f.Add([]byte("- a\n- b\n"))
	f.Add([]byte("base: &b {listen: ':1'}\n<<: *b\n"))
	f.Add([]byte("concurrency: 0x10\nprint: false\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "settings.yaml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		cmd, before := settingsProbe(&got)
		cmd.Before = before
		app := &cli.App{Name: "nodecache", Commands: []*cli.Command{cmd}, ExitErrHandler: func(*cli.Context, error) {}}
		app.Writer, app.ErrWriter = &bytes.Buffer{}, &bytes.Buffer{}
		err := app.RunContext(t.Context(), []string{"nodecache", "probe", "--config", p})
		if b, _ := os.ReadFile(p); !bytes.Equal(b, data) {
			t.Fatal("reading the settings file changed it")
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--config "+p+": ") || len(err.Error()) == len("--config "+p+": ") {
				t.Fatalf("error %q does not name the file and what is wrong", err)
			}
			return
		}
		var doc map[string]any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Fatalf("accepted a file yaml.v3 does not decode: %v", err)
		}
		want := settingsDefaults()
		for k, v := range doc {
			switch want[k].(type) {
			case time.Duration:
				d, err := time.ParseDuration(v.(string))
				if err != nil {
					t.Fatalf("accepted %s: %q", k, v)
				}
				want[k] = d
			case []string:
				var l []string
				for _, s := range v.([]any) {
					l = append(l, s.(string))
				}
				want[k] = l
			default:
				want[k] = v
			}
		}
		for k, w := range want {
			g := got[k]
			if gl, ok := g.([]string); ok {
				if wl, _ := w.([]string); !slices.Equal(gl, wl) && len(gl)+len(wl) > 0 {
					t.Fatalf("%s: the file says %q, the flag holds %q", k, wl, gl)
				}
				continue
			}
			if g != w {
				t.Fatalf("%s: the file says %#v, the flag holds %#v\n%s", k, w, g, data)
			}
		}
	})
}
