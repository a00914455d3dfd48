package containerd_test

import (
	"bytes"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker/config"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

const (
	siteCerts = "/etc/containerd/certs.d"
	// siteConfig is a containerd 2.x config.toml whose config_path gen adopts as it is.
	siteConfig = "version = 3\n\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/etc/containerd/certs.d'\n"
	// siteHostsTOML is a user's hosts.toml for an http-only registry, as containerd's
	// documentation shows it, with a comment and a second endpoint of its own.
	siteHostsTOML = "# our lab registry: plain http\nserver = \"http://registry.local:5000\"\n\n# the DR copy\n[host.\"http://registry-dr.local:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
)

// siteRoot returns a new host root whose config.toml is siteConfig.
func siteRoot(t *testing.T) string {
	t.Helper()
	return bootstraptest.HostRoot(t, map[string]string{containerd.DefaultConfig: siteConfig})
}

// hostsFor asks containerd's ConfigureHosts which endpoints a pull of host tries, in order,
// as scheme://host.
func hostsFor(t *testing.T, root, host string) []string {
	t.Helper()
	hosts := config.ConfigureHosts(t.Context(), config.HostOptions{HostDir: config.HostDirFromRoot(filepath.Join(root, siteCerts))})
	list, err := hosts(host)
	if err != nil {
		t.Fatalf("ConfigureHosts(%s): %v", host, err)
	}
	var out []string
	for _, h := range list {
		out = append(out, h.Scheme+"://"+h.Host)
	}
	return out
}

func planApply(t *testing.T, root string, opts containerd.Options, remove bool) *containerd.Report {
	t.Helper()
	var rep *containerd.Report
	var err error
	if remove {
		rep, err = containerd.PlanRemove(os.DirFS(root), opts)
	} else {
		rep, err = containerd.Plan(os.DirFS(root), opts)
	}
	if err != nil {
		t.Fatalf("plan (remove=%v): %v", remove, err)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	return rep
}

func dirNames(t *testing.T, root string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(root, siteCerts))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() { // per-host directories; not gen's DirMarker file
			out = append(out, e.Name())
		}
	}
	return out
}

// TestCreatedCertsDirRemoved (newuser2 item 15): the hosts.toml directory gen created goes with
// --remove once empty; one that existed before gen (the site's, even empty) stays, as does one
// gen created that holds a file of the site's; a second --remove finds nothing to do.
func TestCreatedCertsDirRemoved(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	opts := containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"docker.io"}}
	certs := containerd.DefaultCertsDir
	for _, tc := range []struct {
		name     string
		before   func(root string) // the host before gen
		after    func(root string) // between gen and --remove
		wantGone bool
	}{
		{"created by gen", func(string) {}, func(string) {}, true},
		{"the site's, empty", func(root string) {
			if err := os.MkdirAll(filepath.Join(root, certs), 0o755); err != nil {
				t.Fatal(err)
			}
		}, func(string) {}, false},
		{"created by gen, then used by the site", func(string) {}, func(root string) {
			bootstraptest.WriteHostFile(t, root, certs+"/quay.io/hosts.toml", []byte("server = \"https://quay.io\"\n"))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			tc.before(root)
			planApply(t, root, opts, false)
			tc.after(root)
			planApply(t, root, opts, true)
			_, err := os.Stat(filepath.Join(root, certs))
			if gone := errors.Is(err, fs.ErrNotExist); gone != tc.wantGone {
				t.Fatalf("after --remove %s gone: %v (stat %v), want %v", certs, gone, err, tc.wantGone)
			}
			if rep := planApply(t, root, opts, true); len(rep.Changes) != 0 {
				t.Fatalf("second --remove: %+v, want nothing to do", rep.Changes)
			}
		})
	}
}

// TestSiteHostsDirectoryAdopted: a user's registry.local:5000 directory, in the colon form
// containerd's documentation shows and in the host_port_ form, gets the mirror as its first host;
// no directory that containerd would read before it is created; the rest of the file stays byte
// for byte; a second run changes nothing; --remove gives back the user's file byte for byte
// (issue 11).
func TestSiteHostsDirectoryAdopted(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	for _, dir := range []string{"registry.local:5000", "registry.local_5000_"} {
		t.Run(dir, func(t *testing.T) {
			t.Parallel()
			root := siteRoot(t)
			file := siteCerts + "/" + dir + "/hosts.toml"
			bootstraptest.WriteHostFile(t, root, file, []byte(siteHostsTOML))
			before := hostsFor(t, root, "registry.local:5000")
			opts := containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"docker.io", "registry.local:5000"}}

			rep := planApply(t, root, opts, false)
			if !slices.Equal(rep.Adopted, []string{file}) {
				t.Fatalf("adopted %v, want [%s]", rep.Adopted, file)
			}
			if got := dirNames(t, root); !slices.Equal(got, []string{"docker.io", dir}) {
				t.Fatalf("directories %v: want only docker.io and the user's %s (nothing shadowing it)", got, dir)
			}
			after := hostsFor(t, root, "registry.local:5000")
			if want := append([]string{m.String()}, before...); !slices.Equal(after, want) {
				t.Fatalf("containerd tries %v, want the mirror, then the user's own %v", after, before)
			}
			got := bootstraptest.ReadHostFile(t, root, file)
			if bak := bootstraptest.ReadHostFile(t, root, file+bootstrap.BackupSuffix); !bytes.Equal(bak, []byte(siteHostsTOML)) {
				t.Fatalf("backup %q, want the user's file", bak)
			}
			// Everything but our lines is the user's, in order.
			var kept []string
			for _, l := range strings.SplitAfter(string(got), "\n") {
				if !strings.Contains(l, "nodecache") && !strings.Contains(l, "10.0.0.5") && !strings.HasPrefix(l, "capabilities") && !strings.HasPrefix(l, "dial_timeout") && l != "\n" {
					kept = append(kept, l)
				}
			}
			var orig []string
			for _, l := range strings.SplitAfter(siteHostsTOML, "\n") {
				if l != "\n" && l != "" {
					orig = append(orig, l)
				}
			}
			if strings.Join(kept, "") != strings.Join(orig, "") {
				t.Fatalf("the user's lines changed:\n%s", got)
			}

			rep = planApply(t, root, opts, false)
			if bootstrap.AnyChanged(rep.Changes) {
				t.Fatalf("second run changes %+v", rep.Changes)
			}

			planApply(t, root, containerd.Options{Daemon: v24}, true)
			if got := bootstraptest.ReadHostFile(t, root, file); !bytes.Equal(got, []byte(siteHostsTOML)) {
				t.Fatalf("after --remove:\n%s\nwant the user's file byte for byte", got)
			}
			if _, err := os.Stat(filepath.Join(root, file+bootstrap.BackupSuffix)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("backup left after restore: %v", err)
			}
			if got := dirNames(t, root); !slices.Equal(got, []string{dir}) {
				t.Fatalf("after --remove: directories %v, want only the user's", got)
			}
		})
	}
}

// TestSiteHostsAdoptedKeepsLaterEdits: a site edit after gen survives --remove; only our table
// goes.
func TestSiteHostsAdoptedKeepsLaterEdits(t *testing.T) {
	t.Parallel()
	root := siteRoot(t)
	file := siteCerts + "/registry.local:5000/hosts.toml"
	bootstraptest.WriteHostFile(t, root, file, []byte(siteHostsTOML))
	opts := containerd.Options{Mirror: bootstraptest.Mirror(t, "http://10.0.0.5:5000"), Daemon: v24, Upstreams: []string{"registry.local:5000"}}
	planApply(t, root, opts, false)
	edited := append(bootstraptest.ReadHostFile(t, root, file), "\n[host.\"http://registry-3.local:5000\"]\n  capabilities = [\"pull\"]\n"...)
	bootstraptest.WriteHostFile(t, root, file, edited)
	planApply(t, root, containerd.Options{Daemon: v24}, true)
	want := siteHostsTOML + "\n[host.\"http://registry-3.local:5000\"]\n  capabilities = [\"pull\"]\n"
	if got := bootstraptest.ReadHostFile(t, root, file); string(got) != want {
		t.Fatalf("after --remove:\n%s\nwant:\n%s", got, want)
	}
}

// TestSiteHostsRefusedWhenContainerdCannotParse: exit 2 naming the file, nothing written.
func TestSiteHostsRefusedWhenContainerdCannotParse(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"not TOML":   "server = \"http://registry.local:5000\n",
		"bad server": "server = \"http://[registry.local:5000\"\n",
		"bad host":   "[host.\"http://%zz:5000\"]\n  capabilities = [\"pull\"]\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			root := siteRoot(t)
			file := siteCerts + "/registry.local:5000/hosts.toml"
			bootstraptest.WriteHostFile(t, root, file, []byte(body))
			_, err := containerd.Plan(os.DirFS(root), containerd.Options{Mirror: bootstraptest.Mirror(t, "http://10.0.0.5:5000"), Daemon: v24, Upstreams: []string{"registry.local:5000"}})
			if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), file) {
				t.Fatalf("err %v: want a refusal naming %s", err, file)
			}
		})
	}
}

// TestSiteCertsDirectoryKept: a directory with only the site's CA keeps it: the hosts.toml gen
// writes there carries it (containerd ignores certificate files once hosts.toml exists).
func TestSiteCertsDirectoryKept(t *testing.T) {
	t.Parallel()
	root := siteRoot(t)
	ca := siteCerts + "/registry.local:5000/ca.crt"
	bootstraptest.WriteHostFile(t, root, ca, bootstraptest.CA(t))
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	rep := planApply(t, root, containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"registry.local:5000"}}, false)
	if got := dirNames(t, root); !slices.Equal(got, []string{"registry.local:5000"}) {
		t.Fatalf("directories %v: want only the site's", got)
	}
	// containerd reads the file under the host root; the CA path in it is a host path.
	data := bootstraptest.ReadHostFile(t, root, siteCerts+"/registry.local:5000/hosts.toml")
	if !mirrorapi.Managed(data) || !bytes.Contains(data, []byte(ca)) {
		t.Fatalf("hosts.toml written:\n%s\nwant ours, naming %s", data, ca)
	}
	bootstraptest.WriteHostFile(t, root, siteCerts+"/registry.local:5000/hosts.toml", bytes.ReplaceAll(data, []byte(ca), []byte(filepath.Join(root, ca))))
	hosts := config.ConfigureHosts(t.Context(), config.HostOptions{HostDir: config.HostDirFromRoot(filepath.Join(root, siteCerts))})
	list, err := hosts("registry.local:5000")
	if err != nil || len(list) != 2 || list[0].Host != m.Host() {
		t.Fatalf("ConfigureHosts: %+v, %v", list, err)
	}
	tr, ok := list[1].Client.Transport.(*http.Transport)
	if !ok || tr.TLSClientConfig == nil || tr.TLSClientConfig.RootCAs == nil {
		t.Fatalf("the registry's client has no CA from %s: %+v", ca, list[1].Client.Transport)
	}
	if len(rep.Adopted) != 0 {
		t.Fatalf("adopted %v: a certificates-only directory gets our own hosts.toml", rep.Adopted)
	}
}

// TestSiteDefaultShadowedReported: a site _default/hosts.toml is no longer read for the hosts gen
// writes a directory for: reported.
func TestSiteDefaultShadowedReported(t *testing.T) {
	t.Parallel()
	root := siteRoot(t)
	bootstraptest.WriteHostFile(t, root, siteCerts+"/_default/hosts.toml", []byte("[host.\"https://corp-proxy.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n"))
	rep, err := containerd.Plan(os.DirFS(root), containerd.Options{Mirror: bootstraptest.Mirror(t, "http://10.0.0.5:5000"), Daemon: v24, Upstreams: []string{"docker.io", "ghcr.io"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ShadowedDefault != siteCerts+"/_default/hosts.toml" || !slices.ContainsFunc(rep.Warnings, func(w string) bool {
		return strings.Contains(w, "_default/hosts.toml") && strings.Contains(w, "docker.io, ghcr.io")
	}) {
		t.Fatalf("shadowed %q, warnings %q", rep.ShadowedDefault, rep.Warnings)
	}
}

// TestOldShadowingDirectoryGivesWay: a host_port_ directory an earlier gen wrote over the user's
// colon-form directory is removed, and the user's adopted.
func TestOldShadowingDirectoryGivesWay(t *testing.T) {
	t.Parallel()
	root := siteRoot(t)
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	opts := containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"registry.local:5000"}}
	planApply(t, root, opts, false) // no site directory yet: ours, host_port_
	bootstraptest.WriteHostFile(t, root, siteCerts+"/registry.local:5000/hosts.toml", []byte(siteHostsTOML))
	if got := hostsFor(t, root, "registry.local:5000"); !slices.Equal(got, []string{m.String(), "https://registry.local:5000"}) {
		t.Fatalf("before: %v (ours shadows the user's)", got)
	}
	planApply(t, root, opts, false)
	if got := dirNames(t, root); !slices.Equal(got, []string{"registry.local:5000"}) {
		t.Fatalf("directories %v, want only the user's", got)
	}
	if got := hostsFor(t, root, "registry.local:5000"); !slices.Equal(got, []string{m.String(), "http://registry-dr.local:5000", "http://registry.local:5000"}) {
		t.Fatalf("after: %v", got)
	}
}

// TestUpstreamHTTPFallback: --upstream registry.lan:5000=http://registry.lan:5000 keeps the
// registry's own http endpoint as the fallback (issue 11).
func TestUpstreamHTTPFallback(t *testing.T) {
	t.Parallel()
	root := siteRoot(t)
	fb, err := bootstrap.Fallbacks([]string{"registry.lan:5000=http://registry.lan:5000", "docker.io"})
	if err != nil {
		t.Fatal(err)
	}
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	planApply(t, root, containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"registry.lan:5000", "docker.io"}, Fallbacks: fb}, false)
	if got := hostsFor(t, root, "registry.lan:5000"); !slices.Equal(got, []string{m.String(), "http://registry.lan:5000"}) {
		t.Fatalf("registry.lan:5000: %v", got)
	}
	if got := hostsFor(t, root, "docker.io"); !slices.Equal(got, []string{m.String(), "https://registry-1.docker.io"}) {
		t.Fatalf("docker.io: %v", got)
	}
	data := bootstraptest.ReadHostFile(t, root, siteCerts+"/registry.lan_5000_/hosts.toml")
	if !bytes.Contains(data, []byte(`server = 'http://registry.lan:5000'`)) && !bytes.Contains(data, []byte(`server = "http://registry.lan:5000"`)) {
		t.Fatalf("hosts.toml:\n%s", data)
	}
}

// TestStaleHostsRemoved: a run with fewer upstreams removes the hosts.toml files an earlier run
// wrote for the others (their directories too when then empty), reports each removal, and
// leaves files without the marker and other files in our directories alone.
func TestStaleHostsRemoved(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, bootstraptest.CorpusFile(t, "containerd/schema2-no-registry", containerd.DefaultConfig))
	certs := "/etc/containerd/certs.d"
	userHosts := []byte("server = 'https://myreg.example'\n")
	bootstraptest.WriteHostFile(t, root, certs+"/myreg.example/hosts.toml", userHosts)
	first := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	second := bootstraptest.Mirror(t, "http://10.0.0.9:5000")

	rep, err := containerd.Plan(os.DirFS(root), containerd.Options{Mirror: first, Daemon: v17,
		Upstreams: []string{"docker.io", "ghcr.io", "registry.k8s.io", "quay.io", "gcr.io", "localhost:5001"}})
	if err != nil {
		t.Fatal(err)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	// A user's certificate in one of our directories keeps that directory.
	bootstraptest.WriteHostFile(t, root, certs+"/quay.io/NOTES", []byte("user's"))

	rep, err = containerd.Plan(os.DirFS(root), containerd.Options{Mirror: second, Daemon: v17, Upstreams: []string{"docker.io"}})
	if err != nil {
		t.Fatal(err)
	}
	var removed []string
	for _, c := range rep.Changes {
		if c.Action == bootstrap.ActionRemove {
			if !strings.HasPrefix(c.Note, "stale: ") {
				t.Errorf("removal of %s not explained: %q", c.Path, c.Note)
			}
			removed = append(removed, c.Path)
		}
	}
	slices.Sort(removed)
	want := []string{certs + "/gcr.io/hosts.toml", certs + "/ghcr.io/hosts.toml", certs + "/localhost_5001_/hosts.toml", certs + "/quay.io/hosts.toml", certs + "/registry.k8s.io/hosts.toml"}
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	if rep.RestartRequired {
		t.Fatal("removing hosts.toml files needs no restart")
	}
	bootstraptest.Apply(t, root, rep.Changes)
	for _, d := range []string{"gcr.io", "ghcr.io", "localhost_5001_", "registry.k8s.io"} {
		if _, err := os.Stat(filepath.Join(root, certs, d)); !os.IsNotExist(err) {
			t.Errorf("%s: directory left: %v", d, err)
		}
	}
	if b := bootstraptest.ReadHostFile(t, root, certs+"/quay.io/NOTES"); string(b) != "user's" {
		t.Fatal("a user's file in our directory was removed")
	}
	if b := bootstraptest.ReadHostFile(t, root, certs+"/myreg.example/hosts.toml"); string(b) != string(userHosts) {
		t.Fatal("a hosts.toml without the marker was touched")
	}
	// containerd's parser: quay.io has no mirror any more, docker.io uses the new one.
	hosts := config.ConfigureHosts(t.Context(), config.HostOptions{HostDir: config.HostDirFromRoot(filepath.Join(root, certs))})
	for name, first := range map[string]string{"quay.io": "quay.io", "docker.io": "10.0.0.9:5000"} {
		rh, err := hosts(name)
		if err != nil || len(rh) == 0 || rh[0].Host != first {
			t.Fatalf("%s: first host %+v (%v), want %s", name, rh, err, first)
		}
	}
}

// TestMigratedHostsAreNotStale: a hosts.toml that holds settings --migrate moved out of
// config.toml is ours but not an upstream's: later runs keep it.
func TestMigratedHostsAreNotStale(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, bootstraptest.CorpusFile(t, "containerd/legacy-mirrors", containerd.DefaultConfig))
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	rep, err := containerd.Plan(os.DirFS(root), containerd.Options{Mirror: m, Daemon: v17, Upstreams: []string{"docker.io"}, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	migrated := "/etc/containerd/certs.d/registry.local_5000_/hosts.toml"
	before := bootstraptest.ReadHostFile(t, root, migrated)
	if before == nil {
		t.Fatal("migrated hosts.toml not written")
	}
	rep, err = containerd.Plan(os.DirFS(root), containerd.Options{Mirror: m, Daemon: v17, Upstreams: []string{"ghcr.io"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Changes {
		if c.Path == migrated && c.Changed() {
			t.Fatalf("migrated settings planned as %s: %s", c.Action, c.Note)
		}
	}
	if !slices.ContainsFunc(rep.Changes, func(c bootstrap.Change) bool {
		return c.Path == "/etc/containerd/certs.d/docker.io/hosts.toml" && c.Action == bootstrap.ActionRemove
	}) {
		t.Fatalf("docker.io (no longer an upstream) not removed: %+v", rep.Changes)
	}
}
