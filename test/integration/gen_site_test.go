package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestGenContainerdAdoptsSiteDirectory is issue 11's containerd case on a real containerd 2.4: a
// user's per-host directory for an http-only registry — the "host:port" form containerd's
// documentation shows, and the "host_port_" form — with server = "http://…". `nodecache gen
// containerd` (the binary) adds the mirror to that hosts.toml and creates no directory that would
// shadow it; a CRI pull goes through nodecache; with nodecache down the next pull goes to the
// user's http server as before gen; `--remove` gives back the user's file byte for byte. status
// says NOT ACTIVE naming the user's file before gen, ACTIVE after gen and a CRI pull.
func TestGenContainerdAdoptsSiteDirectory(t *testing.T) {
	t.Parallel()
	for _, form := range []string{"colon", "host_port_"} {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			bin := requireContainerd(t, runtimetest.EnvContainerd24)

			nc := startAppNodecache(t, 32*1024, 1)
			upstream, host := nc.Upstream, nc.UpstreamHost
			upstream.PushImage(t, "team/app", "v2", mirrortest.Image(t, 32*1024, 1, "linux/amd64"))

			certs := filepath.Join(t.TempDir(), "certs.d")
			dir := host
			if form == "host_port_" {
				dir = name.HostDir(host)
			}
			userFile := filepath.Join(certs, dir, "hosts.toml")
			userHosts := "# our lab registry speaks plain http\nserver = \"http://" + host + "\"\n"
			writeFile(t, userFile, []byte(userHosts))
			c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs})

			// Before gen: the user's file does not name the mirror; status says so, naming it.
			if r := runStatus(t, c, "--mirror", nc.URL); r.Report.State != activation.NotActive || !strings.Contains(r.Report.Reason, userFile) {
				t.Fatalf("status before gen: %s (%s), want NOT ACTIVE naming %s\n%s", r.Report.State, r.Report.Reason, userFile, r.Raw)
			}

			args := []string{"gen", "containerd", "--mirror", nc.URL, "--upstream", host,
				"--containerd-config", c.ConfigFile(), "--containerd-version", c.Version(), "--output", "json"}
			var rep struct {
				Adopted    []string           `json:"adopted"`
				EditedFile string             `json:"edited_file"`
				Changes    []bootstrap.Change `json:"changes"`
			}
			runNodecacheJSON(t, args, &rep)
			// config.toml stays as it is (its single config_path is used); only the user's file
			// changes. (restart_required may still be reported by the start-time rule, since
			// the harness wrote config.toml just before starting containerd.)
			if !slices.Equal(rep.Adopted, []string{userFile}) || rep.EditedFile != "" || len(rep.Changes) != 1 {
				t.Fatalf("gen: adopted %v, edited %q, changes %+v; want only [%s]", rep.Adopted, rep.EditedFile, rep.Changes, userFile)
			}
			ents, err := os.ReadDir(certs)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 1 || ents[0].Name() != dir {
				t.Fatalf("certs.d holds %v: want only the user's %s (nothing shadowing it)", ents, dir)
			}

			ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
			defer cancel()
			if _, err := c.PullImage(ctx, host+"/team/app:v1"); err != nil {
				t.Fatalf("containerd %s after gen: %v\nhosts.toml:\n%s", c.Version(), err, readFile(t, userFile))
			}
			checkAccessLog(t, nc.Requests(t), c.UserAgent(), host)
			// status judges the adopted site file as containerd reads it (newuser F7: it said "no
			// hosts.toml written by nodecache" and asked for the gen just run): ACTIVE with
			// --mirror, with --upstream, and without --mirror (the mirror read from gen's block).
			for _, extra := range [][]string{{"--mirror", nc.URL}, {"--mirror", nc.URL, "--upstream", host}, nil} {
				if r := runStatus(t, c, extra...); r.Report.State != activation.Active || r.Exit != 0 {
					t.Fatalf("status %v after gen and a CRI pull: %s exit %d, want ACTIVE\n%s", extra, r.Report.State, r.Exit, r.Raw)
				}
			}

			// The mirror down: the user's own http server, as before gen.
			nc.Close()
			upstream.ResetRequests()
			if _, err := c.PullImage(ctx, host+"/team/app:v2"); err != nil {
				t.Fatalf("containerd %s with nodecache down: %v (the user's http fallback is lost)\n%s", c.Version(), err, c.LogTail(20))
			}
			var direct bool
			for _, r := range upstream.Requests() {
				direct = direct || (strings.HasPrefix(r.UserAgent, "containerd/") && strings.Contains(r.Path, "/manifests/v2"))
			}
			if !direct {
				t.Fatalf("with nodecache down the user's http registry saw no manifest request from containerd: %+v", upstream.Requests())
			}

			var rm struct {
				Changes []bootstrap.Change `json:"changes"`
			}
			runNodecacheJSON(t, append(args[:len(args)-2:len(args)-2], "--remove", "--output", "json"), &rm)
			if got := readFile(t, userFile); got != userHosts {
				t.Fatalf("after --remove:\n%s\nwant the user's file byte for byte:\n%s", got, userHosts)
			}
			if _, err := os.Stat(userFile + bootstrap.BackupSuffix); !os.IsNotExist(err) {
				t.Fatalf("backup left after --remove: %v", err)
			}
		})
	}
}
