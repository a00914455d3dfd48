package integration

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestContainerdPullsFromOfflineUpstream (issue 24): a cache filled while upstream.test:<port>
// was online is served from the same root with that upstream offline, and the upstream stopped:
// a real containerd 2.4 (a fresh daemon: nothing of the image in its content store) pulls the
// image through CRI by tag and by digest; a tag the cache does not hold fails at once (the
// mirror's 404, then the stopped registry refuses the connection), not after an upstream timeout.
func TestContainerdPullsFromOfflineUpstream(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd24)
	upstream := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 64*1024, 2, "linux/amd64")
	upstream.PushImage(t, "team/app", "v1", img)
	dgst, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "cache")

	online := nodecachetest.Start(t, nodecachetest.Options{UpstreamName: upstreamName, Upstream: upstream, Root: root})
	host := online.UpstreamHost
	alias, _ := name.PathAlias(host)     // upstream.test_<port>: a path component, where ':' cannot be
	online.Pull(t, alias+"/team/app:v1") // every blob through the mirror, so every blob is stored
	online.Close()
	upstream.Stop()

	offline := nodecachetest.Start(t, nodecachetest.Options{Root: root, Upstreams: []name.Upstream{{Name: host, Offline: true}}})
	certs := t.TempDir()
	writeHostsToml(t, filepath.Join(certs, name.HostDir(host), "hosts.toml"), "", host, offline.URL)
	c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs})

	for _, r := range []string{host + "/team/app:v1", host + "/team/app@" + dgst.String()} {
		if err := criPull(t, c, r); err != nil {
			t.Fatalf("containerd %s, upstream offline and stopped: pull %s: %v", c.Version(), r, err)
		}
	}
	checkAccessLog(t, offline.Requests(t), c.UserAgent(), host)

	ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
	defer cancel()
	start := time.Now()
	if _, err := c.PullImage(ctx, host+"/team/app:v9"); err == nil {
		t.Fatal("pulled a tag the cache does not hold")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a tag the cache does not hold failed after %s: want at once (the mirror's 404)", took)
	}
}
