package mirror_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// diffRequest is one read request of the differential harness: path below /v2/team/app/ (or
// the whole path when it starts with /v2/), method and request headers.
type diffRequest struct {
	name   string
	method string
	path   string
	header http.Header
}

// answer is what the harness compares of one response.
type answer struct {
	Status                                                 int
	Code                                                   string // first OCI error code
	ContentType, ContentLength, Digest, ContentRange, Link string
	Body                                                   []byte // 2xx only
}

func (a answer) fields() map[string]string {
	return map[string]string{
		"status": fmt.Sprint(a.Status), "code": a.Code, "Content-Type": a.ContentType,
		"Content-Length": a.ContentLength, "Docker-Content-Digest": a.Digest,
		"Content-Range": a.ContentRange, "Link": a.Link, "body": sha256Hex(a.Body),
	}
}

func sha256Hex(b []byte) string {
	if b == nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ask sends rq to base (scheme://host) with query appended and reduces the response to an answer.
func ask(t *testing.T, base, query string, rq diffRequest) answer {
	t.Helper()
	p := rq.path
	if !strings.HasPrefix(p, "/v2/") {
		p = "/v2/team/app/" + p
	}
	target := base + p
	if query != "" {
		sep := "?"
		if strings.Contains(target, "?") {
			sep = "&"
		}
		target += sep + query
	}
	resp, body := get(t, rq.method, target, rq.header)
	a := answer{
		Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"),
		ContentLength: resp.Header.Get("Content-Length"), Digest: resp.Header.Get("Docker-Content-Digest"),
		ContentRange: resp.Header.Get("Content-Range"), Link: resp.Header.Get("Link"),
	}
	if resp.StatusCode < 300 {
		a.Body = body
		if rq.method == http.MethodHead {
			a.Body = nil
		}
	} else {
		var e struct {
			Errors []struct{ Code string } `json:"errors"`
		}
		if json.Unmarshal(body, &e) == nil && len(e.Errors) > 0 {
			a.Code = e.Errors[0].Code
		}
	}
	if mt, params, err := mime.ParseMediaType(a.ContentType); err == nil && mt == "multipart/byteranges" {
		// The boundary is random per response: compare the parts, not the boundary.
		a.ContentType = mt
		a.Body = bytes.ReplaceAll(a.Body, []byte(params["boundary"]), []byte("BOUNDARY"))
		a.ContentLength = ""
	}
	if a.Status >= 400 && a.ContentLength != "" {
		// Error messages say different things by design (nodecache names the upstream and what
		// it answered): the OCI error code is compared instead of the body, and of its length
		// only that there is one (a 416 must have it).
		a.ContentLength = "present"
	}
	if a.Link != "" {
		// nodecache keeps the client's ?ns= in the Link; compare without it.
		a.Link = strings.NewReplacer("&ns=upstream.test", "", "ns=upstream.test&", "").Replace(a.Link)
	}
	return a
}

// knownDifferences lists every accepted difference between distribution answering directly and
// nodecache, keyed "METHOD request name: field", with its reason. Anything else fails the
// harness. Not compared at all: X-Nodecache-Cache (nodecache's own), error message texts (see
// ask). Multi-range requests are answered alike (206 multipart/byteranges), so nothing is listed
// for them.
var knownDifferences = map[string]string{}

// TestDifferential: one list of read requests — Accept variants, Range forms, tags with n and
// last, unknown and malformed names, tags and digests, a blob digest at /manifests/, a manifest
// digest at /blobs/ — sent to distribution's registry directly and through nodecache, cold
// (a fresh cache per request) and warm (after the image was pulled through): status, OCI error
// code, Content-Type, Content-Length, Docker-Content-Digest, Content-Range, Link and the body
// must be the same, except the differences listed with their reasons in knownDifferences.
func TestDifferential(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 64<<10, 2, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	up.PushImage(t, "team/app", "v2", img)
	idx := mirrortest.MultiPlatformIndex(t, 1024, 1)
	up.PushIndex(t, "team/app", "multi", idx)
	manDigest := digestOf(t, img)
	idxDigest := digestOf(t, idx)
	blob := mirrortest.LayerDigests(t, img)[0].String()
	cfg, _ := img.ConfigName()
	missing := "sha256:" + strings.Repeat("0f", 32)

	all := manifestAccept
	oci := http.Header{"Accept": {"application/vnd.oci.image.manifest.v1+json"}}
	docker := http.Header{"Accept": {"application/vnd.docker.distribution.manifest.v2+json"}}
	rng := func(v string) http.Header { return http.Header{"Range": {v}} }
	var reqs []diffRequest
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		reqs = append(reqs,
			diffRequest{"base", m, "/v2/", nil},
			diffRequest{"tag, every type accepted", m, "manifests/v1", all},
			diffRequest{"tag, OCI accepted", m, "manifests/v1", oci},
			diffRequest{"tag, Docker only accepted", m, "manifests/v1", docker},
			diffRequest{"tag, no Accept", m, "manifests/v1", nil},
			diffRequest{"digest", m, "manifests/" + manDigest, all},
			diffRequest{"digest, no Accept", m, "manifests/" + manDigest, nil},
			diffRequest{"index by tag", m, "manifests/multi", all},
			diffRequest{"index by tag, manifest types only", m, "manifests/multi", oci},
			diffRequest{"index by digest", m, "manifests/" + idxDigest, all},
			diffRequest{"unknown tag", m, "manifests/nope", all},
			diffRequest{"unknown digest", m, "manifests/" + missing, all},
			diffRequest{"malformed digest at manifests", m, "manifests/sha256:xyz", all},
			diffRequest{"blob digest at manifests", m, "manifests/" + blob, all},
			diffRequest{"unknown repository", m, "/v2/team/nothing/manifests/v1", all},
			diffRequest{"blob", m, "blobs/" + blob, nil},
			diffRequest{"config blob", m, "blobs/" + cfg.String(), nil},
			diffRequest{"blob range a-b", m, "blobs/" + blob, rng("bytes=0-99")},
			diffRequest{"blob range a-", m, "blobs/" + blob, rng("bytes=100-")},
			diffRequest{"blob range -n", m, "blobs/" + blob, rng("bytes=-50")},
			diffRequest{"blob range unsatisfiable", m, "blobs/" + blob, rng("bytes=99999999-")},
			diffRequest{"blob multi-range", m, "blobs/" + blob, rng("bytes=0-1,5-6")},
			diffRequest{"manifest digest at blobs", m, "blobs/" + manDigest, nil},
			diffRequest{"unknown blob", m, "blobs/" + missing, nil},
			diffRequest{"malformed blob digest", m, "blobs/sha256:xyz", nil},
			// Names, tags and digests outside the grammar of distribution's routes: its router
			// answers a plain 404 "page not found" before any handler runs.
			diffRequest{"uppercase repository", m, "/v2/team/APP/manifests/v1", all},
			diffRequest{"uppercase repository, blob", m, "/v2/team/APP/blobs/" + blob, nil},
			diffRequest{"200-character tag", m, "manifests/" + strings.Repeat("t", 200), all},
			diffRequest{"129-character tag", m, "manifests/" + strings.Repeat("t", 129), all},
			diffRequest{"128-character tag", m, "manifests/" + strings.Repeat("t", 128), all},
			diffRequest{"blob reference that is no digest", m, "blobs/nodigest", nil},
			diffRequest{"repository name over 255 characters", m, "/v2/team/" + strings.Repeat("a", 250) + "/manifests/v1", all},
		)
	}
	for _, q := range []string{"", "n=1", "n=1&last=multi", "n=2", "n=0", "n=-1", "last=zzz", "n=x"} {
		p := "tags/list"
		if q != "" {
			p += "?" + q
		}
		reqs = append(reqs, diffRequest{"tags " + q, http.MethodGet, p, nil})
	}
	reqs = append(reqs, diffRequest{"tags of an unknown repository", http.MethodGet, "/v2/team/nothing/tags/list", nil},
		diffRequest{"tags of an uppercase repository", http.MethodGet, "/v2/team/APP/tags/list", nil})

	newCache := func() *harness {
		return newHarnessFor(t, up)
	}
	direct := "http://" + up.Addr
	var problems []string
	compare := func(phase string, rq diffRequest, want, got answer) {
		wf, gf := want.fields(), got.fields()
		keys := make([]string, 0, len(wf))
		for k := range wf {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if wf[k] == gf[k] {
				continue
			}
			id := rq.method + " " + rq.name + ": " + k
			if _, ok := knownDifferences[id]; ok {
				continue
			}
			problems = append(problems, fmt.Sprintf("%s %s: direct %q, nodecache %q", phase, id, wf[k], gf[k]))
		}
	}
	wants := make([]answer, len(reqs))
	for i, rq := range reqs {
		wants[i] = ask(t, direct, "", rq)
	}
	// Cold: a fresh cache for every request.
	for i, rq := range reqs {
		h := newCache()
		compare("cold", rq, wants[i], ask(t, "http://"+h.host, "ns=upstream.test", rq))
		_ = h.m.WaitIdle(t.Context())
	}
	// Warm: everything pulled through first.
	h := newCache()
	for _, tag := range []string{"v1", "multi"} {
		ref := ref(t, h.host+"/upstream.test/team/app:"+tag)
		desc, err := remote.Get(ref, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("warm up %s: %v", tag, err)
		}
		if tag == "v1" {
			im, _ := desc.Image()
			ls, _ := im.Layers()
			for _, l := range ls {
				rc, err := l.Compressed()
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, rc)
				_ = rc.Close()
			}
			_, _ = im.RawConfigFile()
		}
	}
	_ = h.m.WaitIdle(t.Context())
	for i, rq := range reqs {
		compare("warm", rq, wants[i], ask(t, "http://"+h.host, "ns=upstream.test", rq))
	}
	if len(problems) > 0 {
		t.Errorf("%d unexplained differences between distribution and nodecache:\n%s", len(problems), strings.Join(problems, "\n"))
	}
}
