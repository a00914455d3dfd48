package mirror_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestWrongUpstreamAnswerIs502 (issue 23, one status code per cause): a manifest asked by digest
// whose upstream bytes do not match it, and a manifest over 4 MiB, are the upstream's wrong
// answers: 502 with an OCI error body naming what was wrong (before: 503 UNAVAILABLE, which says
// the upstream is unreachable or failing and which warm retries five times).
func TestWrongUpstreamAnswerIs502(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		body       func(real []byte) []byte
	}{
		{"bytes that do not match the digest", "does not match", func(real []byte) []byte {
			return []byte(strings.Replace(string(real), `"schemaVersion":2`, `"schemaVersion": 2`, 1))
		}},
		{"a manifest over 4 MiB", "larger than", func(real []byte) []byte {
			return []byte(strings.Repeat(" ", 4<<20+1) + string(real))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
			real, err := img.RawManifest()
			if err != nil {
				t.Fatal(err)
			}
			d, _ := img.Digest()
			up.Intercept(http.MethodGet, "/manifests/", func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
				_, _ = w.Write(tc.body(real))
			})
			h := newHarnessFor(t, up)
			resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/"+d.String()), manifestAccept)
			var e struct {
				Errors []struct{ Code, Message string } `json:"errors"`
			}
			_ = json.Unmarshal(body, &e)
			if resp.StatusCode != http.StatusBadGateway || len(e.Errors) != 1 || !strings.Contains(e.Errors[0].Message, tc.want) ||
				resp.Header.Get(mirrorapi.HeaderErrorCode) == "" {
				t.Errorf("%d %s (error code header %q); want 502 naming %q", resp.StatusCode, body, resp.Header.Get(mirrorapi.HeaderErrorCode), tc.want)
			}
		})
	}
}

// errorBody returns the message of an OCI error body's only error ("" when it is none).
func errorBody(body []byte) string {
	var e struct {
		Errors []struct{ Code, Message string } `json:"errors"`
	}
	if json.Unmarshal(body, &e) != nil || len(e.Errors) != 1 {
		return ""
	}
	return e.Errors[0].Message
}

// TestWrongBlobAnswerIs502 (issue 23, one status code per cause): a blob GET answered 206 for
// another range than the one asked for (a Content-Range that starts elsewhere, or none), and a
// blob body that keeps ending before its Content-Length without a byte, are the upstream's
// wrong answers: 502 with an OCI error body naming what was wrong, before any byte of the blob
// (before: the misplaced bytes were written as the blob's, and the client got 200 and a cut once
// the digest failed; the empty bodies were retried five times, by when the client had a 200).
func TestWrongBlobAnswerIs502(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		// gets is how many upstream GETs the fill makes before it gives up.
		gets   int
		answer func(w http.ResponseWriter, data []byte)
	}{
		{"206 from byte 100 for a request without Range", "Content-Range", 1, func(w http.ResponseWriter, data []byte) {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 100-%d/%d", len(data)-1, len(data)))
			w.Header().Set("Content-Length", strconv.Itoa(len(data)-100))
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(data[100:])
		}},
		{"206 without Content-Range", "Content-Range", 1, func(w http.ResponseWriter, data []byte) {
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(data)
		}},
		{"200 whose body ends at once", "before its stated length", 3, func(w http.ResponseWriter, data []byte) {
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler) // the connection closes with nothing of the body sent
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The upstream timeout sets how long the client's headers wait for a first byte
			// once the upstream answered 2xx (a third of it): 3 s, well past the 0.75 s of the
			// attempts that a short body gets.
			f := newBlobFixture(t, 512<<10, mirror.Options{UpstreamTimeout: 9 * time.Second})
			f.up.Intercept(http.MethodGet, "/blobs/sha256:", func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
				tc.answer(w, f.data)
			})
			resp, err := http.Get(f.url())
			if err != nil {
				t.Fatal(err)
			}
			body, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(errorBody(body), tc.want) || resp.Header.Get(mirrorapi.HeaderErrorCode) == "" {
				t.Fatalf("%d, %d bytes (read error %v) %.300q (error code header %q); want 502 naming %q",
					resp.StatusCode, len(body), rerr, body, resp.Header.Get(mirrorapi.HeaderErrorCode), tc.want)
			}
			f.h.waitIdle(t)
			if n := f.up.Count(http.MethodGet, "/blobs/"); n != tc.gets {
				t.Errorf("upstream GETs: %d, want %d", n, tc.gets)
			}
		})
	}
}

// TestBadPartialAnswerOnResume: a stream that breaks is resumed with Range; an upstream that
// answers the resume with a 206 from another offset ends the fill at once. Before, its bytes were
// written where the resume began and released to the client (every byte but the last), so the
// client got bytes that are not the blob's before the digest check cut it.
func TestBadPartialAnswerOnResume(t *testing.T) {
	t.Parallel()
	f := newBlobFixture(t, 2*mirrortest.MiB, mirror.Options{})
	half := len(f.data) / 2
	f.up.Intercept(http.MethodGet, "/blobs/sha256:", func(_ http.Handler, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(len(f.data)))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(f.data[:half])
			_ = http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
		// The whole blob as a 206, whatever was asked.
		w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", len(f.data)-1, len(f.data)))
		w.Header().Set("Content-Length", strconv.Itoa(len(f.data)))
		w.WriteHeader(http.StatusPartialContent)
		_, _ = w.Write(f.data)
	})
	resp, err := http.Get(f.url())
	if err != nil {
		t.Fatal(err)
	}
	body, rerr := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if rerr == nil {
		t.Errorf("the response ended cleanly (%d, %d bytes); want a cut", resp.StatusCode, len(body))
	}
	if !bytes.HasPrefix(f.data, body) {
		i := 0
		for i < len(body) && body[i] == f.data[i] {
			i++
		}
		t.Fatalf("the client got %d bytes, not the blob's from byte %d on", len(body), i)
	}
	f.h.waitIdle(t)
	if n := f.up.Count(http.MethodGet, "/blobs/"); n != 2 {
		t.Errorf("upstream GETs: %d, want 2 (the broken stream, the bad resume)", n)
	}
}
