package clitext_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
)

// TestOriginsExplain (newuser2 item 13): an error naming a flag whose value the user did not type
// says where it came from (an environment variable, the shared NODECACHE_CONFIG file), and one
// naming a flag left at its default while the shared file holds another command's key of a
// related name (serve's listen for cache ls's --listen-url) says which key to add. A value
// given on the command line is not traced. Not parallel: it sets the process environment.
func TestOriginsExplain(t *testing.T) {
	shared := filepath.Join(t.TempDir(), "shared.yaml")
	if err := os.WriteFile(shared, []byte("listen: \"127.0.0.1:25010\"\nupstream: [docker.io=http://127.0.0.1:25001]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, configEnv, mirrorEnv string
		args                       []string
		fails                      string // the command's error
		want                       string
	}{
		{"from the shared file", shared, "", nil, "--upstream docker.io=http://127.0.0.1:25001: give docker.io alone",
			"--upstream docker.io=http://127.0.0.1:25001: give docker.io alone (--upstream: from NODECACHE_CONFIG=" + shared + ")"},
		{"from a variable", "", "bogus", nil, `--mirror "bogus": no scheme`, `--mirror "bogus": no scheme (--mirror: from NODECACHE_MIRROR)`},
		{"given on the command line", "", "", []string{"--mirror", "bogus"}, `--mirror "bogus": no scheme`, `--mirror "bogus": no scheme`},
		{"a related key of another command", shared, "", nil, "connection refused: is nodecache serve running at http://127.0.0.1:5000? (--listen-url)",
			"connection refused: is nodecache serve running at http://127.0.0.1:5000? (--listen-url) (NODECACHE_CONFIG=" + shared +
				" sets listen: 127.0.0.1:25010, another command's key, but not listen-url, which this command reads: add listen-url to it)"},
		{"a related flag given", shared, "", []string{"--listen-url", "http://127.0.0.1:5000"}, "is nodecache serve running? (--listen-url)", "is nodecache serve running? (--listen-url)"},
		{"a flag named in passing only", shared, "", nil, "--upstream-x is not --upstream-y", "--upstream-x is not --upstream-y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODECACHE_CONFIG", tc.configEnv)
			t.Setenv("NODECACHE_MIRROR", tc.mirrorEnv)
			var upstreams cli.StringSlice
			var origins *clitext.Origins
			cmd := &cli.Command{Name: "probe", Flags: []cli.Flag{
				&cli.StringFlag{Name: "config"},
				&cli.StringFlag{Name: "mirror", EnvVars: []string{"NODECACHE_MIRROR"}},
				&cli.StringFlag{Name: "listen-url", Value: "http://127.0.0.1:5000", EnvVars: []string{"NODECACHE_LISTEN_URL"}},
				&cli.StringSliceFlag{Name: "upstream", Destination: &upstreams, EnvVars: []string{"NODECACHE_UPSTREAM"}},
			}}
			cmd.Before = func(c *cli.Context) error {
				origins = clitext.NewOrigins(c, cmd, "config", "NODECACHE_CONFIG")
				return nil
			}
			cmd.Action = func(*cli.Context) error { return origins.Explain(errors.New(tc.fails)) }
			app := &cli.App{Name: "nodecache", Commands: []*cli.Command{cmd}, ExitErrHandler: func(*cli.Context, error) {}}
			err := app.RunContext(t.Context(), append([]string{"nodecache", "probe"}, tc.args...))
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error %v\nwant %s", err, tc.want)
			}
		})
	}
}
