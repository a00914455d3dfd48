package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// manifestAccept is the Accept header of the clients' manifest requests (containerd's list).
const manifestAccept = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, " +
	"application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json"

// request is one client request.
type request struct {
	obj *object
	// head: a HEAD, else a GET.
	head bool
	// byDigest: a manifest asked by its digest, else by its tag.
	byDigest bool
	// from and to are a blob GET's Range, bytes=from-to (to -1: bytes=from-); from -1: none.
	from, to int64
	// cached: obj was cached, and checked, before the round (it must be served, not refused).
	cached bool
}

func (r request) String() string {
	m := "GET"
	if r.head {
		m = "HEAD"
	}
	s := m + " " + r.obj.String()
	switch {
	case r.obj.manifest && r.byDigest:
		s += " by digest"
	case r.from >= 0 && r.to >= 0:
		s += fmt.Sprintf(" Range: bytes=%d-%d", r.from, r.to)
	case r.from >= 0:
		s += fmt.Sprintf(" Range: bytes=%d-", r.from)
	}
	if r.cached {
		s += " (cached)"
	}
	return s
}

// outcome is the judgement of one response.
type outcome int

const (
	// outOK: a 2xx whose body (for a HEAD: Content-Length and Docker-Content-Digest) is the
	// content, or the range of it, asked for.
	outOK outcome = iota
	// outCut: the transfer broke (no answer, or a body shorter than announced): a client
	// retries, nothing wrong was accepted.
	outCut
	// outRefused: an error status that is a correct answer for the round's kind.
	outRefused
	// outWrongBytes: a complete 2xx whose bytes are not the content (the one thing nodecache
	// must never answer).
	outWrongBytes
	// outWrongAnswer: an error status that is not a correct answer for the round's kind (a 404
	// for content the upstream has, a 500, a 503 for an upstream's wrong answer, a 416 for a
	// range inside the content), or a 2xx with the right bytes, or none (a HEAD), whose headers
	// misstate the content (its length, its digest).
	outWrongAnswer
)

// result is a judged response.
type result struct {
	out outcome
	// status is the HTTP status (0: none arrived).
	status int
	// detail says what was wrong, or where the transfer broke.
	detail string
	// wrongBeforeCut: a cut transfer whose bytes before the cut were already not the content.
	wrongBeforeCut bool
	// took is how long the request took.
	took time.Duration
}

// do sends r to base (serve's URL) and judges the response: refusals are the statuses that are a
// correct answer for the round's kind, for content not cached before it.
func do(ctx context.Context, client *http.Client, base string, r request, refused func(int, http.Header) bool) result {
	start := time.Now()
	res := send(ctx, client, base, r, refused)
	res.took = time.Since(start)
	return res
}

func send(ctx context.Context, client *http.Client, base string, r request, refused func(int, http.Header) bool) result {
	o := r.obj
	path := "/v2/" + o.repo + "/blobs/" + o.digest.String()
	if o.manifest {
		ref := o.tag
		if r.byDigest {
			ref = o.digest.String()
		}
		path = "/v2/" + o.repo + "/manifests/" + ref
	}
	method := http.MethodGet
	if r.head {
		method = http.MethodHead
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
	if err != nil {
		return result{out: outCut, detail: err.Error()}
	}
	if o.manifest {
		req.Header.Set("Accept", manifestAccept)
	}
	if r.from >= 0 {
		v := fmt.Sprintf("bytes=%d-", r.from)
		if r.to >= 0 {
			v += fmt.Sprint(r.to)
		}
		req.Header.Set("Range", v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{out: outCut, detail: "no answer: " + err.Error()}
	}
	defer resp.Body.Close()
	res := result{status: resp.StatusCode}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		res.detail = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		if refused(resp.StatusCode, resp.Header) {
			res.out = outRefused
		} else {
			res.out = outWrongAnswer
		}
		return res
	}
	if r.head {
		return judgeHead(res, resp, o)
	}
	return judgeBody(res, resp, r)
}

// judgeHead: a 2xx HEAD carries the content's length and digest.
func judgeHead(res result, resp *http.Response, o *object) result {
	switch d := resp.Header.Get("Docker-Content-Digest"); {
	case resp.StatusCode != http.StatusOK:
		res.out, res.detail = outWrongAnswer, fmt.Sprintf("HEAD answered %d", resp.StatusCode)
	case resp.ContentLength != o.size():
		res.out, res.detail = outWrongAnswer, fmt.Sprintf("HEAD: Content-Length %d, the content has %d bytes", resp.ContentLength, o.size())
	case d != "" && d != o.digest.String():
		res.out, res.detail = outWrongAnswer, "HEAD: Docker-Content-Digest "+d
	default:
		res.out = outOK
	}
	return res
}

// judgeBody reads a 2xx body and compares it, as it arrives, with the content (or the range of
// it) asked for. Bytes that are not the content, in a complete body, are wrong bytes; right
// bytes under headers that misstate them (a Content-Range with another length, another
// Docker-Content-Digest) are a wrong answer; a 206 for another range than the one asked for is
// judged as wrong bytes.
func judgeBody(res result, resp *http.Response, r request) result {
	o := r.obj
	want, label, misstated := o.data, "200", ""
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusPartialContent:
		if o.manifest || r.from < 0 {
			res.out, res.detail = outWrongAnswer, "206 to a request without Range"
			return res
		}
		last := o.size() - 1
		if r.to >= 0 {
			last = min(r.to, last)
		}
		want, label = o.data[r.from:last+1], fmt.Sprintf("bytes %d-%d/%d", r.from, last, o.size())
		switch cr := resp.Header.Get("Content-Range"); {
		case cr == label:
		case strings.HasPrefix(cr, fmt.Sprintf("bytes %d-%d/", r.from, last)):
			misstated = "Content-Range " + cr + ", the content has " + fmt.Sprint(o.size()) + " bytes"
		default:
			want, label = nil, "Content-Range "+cr+", want "+label
		}
	default:
		res.out, res.detail = outWrongAnswer, fmt.Sprintf("a %d", resp.StatusCode)
		return res
	}
	if d := resp.Header.Get("Docker-Content-Digest"); o.manifest && d != "" && d != o.digest.String() {
		misstated = "Docker-Content-Digest " + d
	}
	n, wrong, err := compare(resp.Body, want)
	switch {
	case err != nil:
		res.out, res.wrongBeforeCut = outCut, wrong
		res.detail = fmt.Sprintf("%s cut after %d bytes: %v", label, n, err)
	case wrong || want == nil || n != int64(len(want)):
		res.out = outWrongBytes
		res.detail = fmt.Sprintf("%s complete, %d bytes, not the %d bytes of the content asked for (%s)", label, n, len(want), firstDiff(n, wrong))
	case misstated != "":
		res.out, res.detail = outWrongAnswer, fmt.Sprintf("%s: the right %d bytes, but %s", label, n, misstated)
	default:
		res.out = outOK
	}
	return res
}

func firstDiff(n int64, wrong bool) string {
	if wrong {
		return "bytes differ"
	}
	return "length differs"
}

// compare reads body to its end and reports how many bytes it had, whether any of them differs
// from want (or goes past it), and the read error (nil at a clean end).
func compare(body io.Reader, want []byte) (n int64, wrong bool, err error) {
	buf := make([]byte, 256<<10)
	for {
		k, rerr := body.Read(buf)
		if k > 0 {
			if n+int64(k) > int64(len(want)) || !bytes.Equal(buf[:k], want[n:n+int64(k)]) {
				wrong = true
			}
			n += int64(k)
		}
		if errors.Is(rerr, io.EOF) {
			return n, wrong, nil
		}
		if rerr != nil {
			return n, wrong, rerr
		}
	}
}
