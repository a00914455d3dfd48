package mirror_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// dialLog records every host the mirror's upstream transport is asked to reach.
type dialLog struct {
	base http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (d *dialLog) RoundTrip(r *http.Request) (*http.Response, error) {
	d.mu.Lock()
	d.seen = append(d.seen, r.URL.Host)
	d.mu.Unlock()
	return d.base.RoundTrip(r)
}

func (d *dialLog) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.seen
	d.seen = nil
	return out
}

// TestClosedWorldRouting (issue 9, items 6 and 7): a configured upstream answers under every
// name of pkg/name's alias table and, with a port, under its port-free path alias; a first path
// component that is a registry host but not configured is 404 NAME_UNKNOWN naming it, and
// nothing is sent upstream; with ?ns= the path is a repository as given.
func TestClosedWorldRouting(t *testing.T) {
	t.Parallel()
	hub, ported := mirrortest.NewRegistry(t), mirrortest.NewRegistry(t)
	alpine := mirrortest.Image(t, 2048, 1, "linux/amd64")
	teamHub := mirrortest.Image(t, 2048, 1, "linux/amd64")
	dotted := mirrortest.Image(t, 2048, 1, "linux/amd64")
	teamPorted := mirrortest.Image(t, 2048, 1, "linux/amd64")
	hub.PushImage(t, "library/alpine", "3", alpine)
	hub.PushImage(t, "team/app", "v1", teamHub)
	hub.PushImage(t, "my.team/app", "v1", dotted)
	ported.PushImage(t, "team/app", "v1", teamPorted)

	dl := &dialLog{base: testTransport(3 * time.Second)}
	h := newHarness(t, mirror.Options{
		Upstreams: []name.Upstream{upstreamFor(t, "docker.io", hub), upstreamFor(t, "reg.local:5005", ported)},
		Transport: dl,
	})

	for _, tc := range []struct {
		name, path string
		want       string // digest; "" = refused with 404 NAME_UNKNOWN
		unknown    string // the name the refusal must name
	}{
		{"name prefix", "/v2/docker.io/library/alpine/manifests/3", digestOf(t, alpine), ""},
		{"alias index.docker.io prefix", "/v2/index.docker.io/library/alpine/manifests/3", digestOf(t, alpine), ""},
		{"alias registry-1.docker.io prefix, library added", "/v2/registry-1.docker.io/alpine/manifests/3", digestOf(t, alpine), ""},
		{"alias in upper case", "/v2/Index.Docker.IO/team/app/manifests/v1", digestOf(t, teamHub), ""},
		{"ns alias", "/v2/alpine/manifests/3?ns=index.docker.io", digestOf(t, alpine), ""},
		{"ns with an alias prefix stripped", "/v2/registry-1.docker.io/alpine/manifests/3?ns=docker.io", digestOf(t, alpine), ""},
		{"default upstream", "/v2/team/app/manifests/v1", digestOf(t, teamHub), ""},
		{"ns: a dotted first component is a repository", "/v2/my.team/app/manifests/v1?ns=docker.io", digestOf(t, dotted), ""},
		{"ported name prefix", "/v2/reg.local:5005/team/app/manifests/v1", digestOf(t, teamPorted), ""},
		{"ported path alias prefix", "/v2/reg.local_5005/team/app/manifests/v1", digestOf(t, teamPorted), ""},
		{"ported ns", "/v2/team/app/manifests/v1?ns=reg.local:5005", digestOf(t, teamPorted), ""},
		{"ported ns with path alias stripped", "/v2/reg.local_5005/team/app/manifests/v1?ns=reg.local:5005", digestOf(t, teamPorted), ""},
		{"unknown host", "/v2/evil.example/team/app/manifests/v1", "", "evil.example"},
		{"unknown host with port", "/v2/other.test:5000/team/app/manifests/v1", "", "other.test:5000"},
		{"localhost", "/v2/localhost/team/app/manifests/v1", "", "localhost"},
		{"another port of a configured host", "/v2/reg.local:5006/team/app/manifests/v1", "", "reg.local:5006"},
		{"path alias of an unconfigured port", "/v2/reg.local_5006/team/app/manifests/v1", "", "reg.local_5006"},
		{"dotted repository without ns", "/v2/my.team/app/manifests/v1", "", "my.team"},
		{"unknown host, tags", "/v2/evil.example/team/app/tags/list", "", "evil.example"},
		{"unknown host, blob", "/v2/evil.example/team/app/blobs/sha256:" + strings.Repeat("a", 64), "", "evil.example"},
		{"path alias as ns", "/v2/team/app/manifests/v1?ns=reg.local_5005", "", "reg.local_5005"},
	} {
		// One after the other, not as parallel subtests: the dial log is shared by the mirror.
		dl.take()
		resp, body := get(t, http.MethodGet, fmtURL(h, tc.path), manifestAccept)
		if tc.want != "" {
			if got := resp.Header.Get("Docker-Content-Digest"); resp.StatusCode != http.StatusOK || got != tc.want {
				t.Errorf("%s: GET %s: %d %s, want 200 %s: %s", tc.name, tc.path, resp.StatusCode, got, tc.want, body)
			}
			continue
		}
		var doc struct {
			Errors []struct{ Code, Message string } `json:"errors"`
		}
		if resp.StatusCode != http.StatusNotFound || json.Unmarshal(body, &doc) != nil || len(doc.Errors) != 1 ||
			doc.Errors[0].Code != "NAME_UNKNOWN" || !strings.Contains(doc.Errors[0].Message, `"`+tc.unknown+`"`) {
			t.Errorf("%s: GET %s: %d %s; want 404 NAME_UNKNOWN naming %q", tc.name, tc.path, resp.StatusCode, body, tc.unknown)
		}
		if seen := dl.take(); len(seen) != 0 {
			t.Errorf("%s: GET %s was refused but the mirror dialled %v", tc.name, tc.path, seen)
		}
	}
}

// TestAliasConfiguredTwice: an upstream configured under two names of one alias table entry is
// refused, as two entries for one registry would split its cache.
func TestAliasConfiguredTwice(t *testing.T) {
	t.Parallel()
	r := mirrortest.NewRegistry(t)
	_, err := mirror.New(t.Context(), mirror.Options{Upstreams: []name.Upstream{upstreamFor(t, "docker.io", r), upstreamFor(t, "index.docker.io", r)}})
	if err == nil || !strings.Contains(err.Error(), `"index.docker.io" is configured twice (as "docker.io")`) {
		t.Fatalf("mirror.New with docker.io and index.docker.io: %v", err)
	}
	m, err := mirror.New(t.Context(), mirror.Options{Upstreams: []name.Upstream{upstreamFor(t, "index.docker.io", r)}, DefaultUpstream: "registry-1.docker.io"})
	if err != nil {
		t.Fatalf("default upstream given as an alias of the configured name: %v", err)
	}
	_ = m.Close()
}
