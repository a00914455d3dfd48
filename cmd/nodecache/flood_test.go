package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestConnectionFlood (issue 23, connections): a serve process whose descriptor limit is 256
// (prlimit, soft and hard) takes 300 connections from 127.0.0.2 that each send GET /v2/ and
// then stay idle, and still serves a warm and a cold blob to 127.0.0.1 within 10 s, and
// /healthz. Before, the idle connections held every descriptor until --idle-timeout (30 s):
// accept failed with "too many open files" and the blob requests timed out.
func TestConnectionFlood(t *testing.T) {
	t.Parallel()
	prlimit := runtimetest.Find(t, runtimetest.Prlimit) // it lowers serve's descriptor limit
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, mirrortest.MiB, 2, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	warm, warmData := mirrortest.LayerBlob(t, img, 0)
	cold, coldData := mirrortest.LayerBlob(t, img, 1)

	dir := t.TempDir()
	listen := nodecachetest.FreeAddr(t)
	var logs mirrortest.LogBuffer
	cmd := exec.Command(prlimit, "--nofile=256:256", "--", binary, "serve", "--listen", listen,
		"--root", filepath.Join(dir, "root"), "--upstream", "upstream.test="+up.URL.String(), "--log-format", "json")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	base := "http://" + listen
	waitReady(t, nil, base+"/readyz", cmd.Process)
	if !strings.Contains(logs.String(), `"budget":64,"descriptor_limit":256`) {
		t.Fatalf("serve did not log a connection budget of 64 for a descriptor limit of 256:\n%s", logs.String())
	}

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	blobURL := func(d string) string { return base + "/v2/upstream.test/team/app/blobs/" + d }
	fetch := func(what, url string, want []byte) {
		t.Helper()
		start := time.Now()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("%s: %v (after %s)\n%s", what, err, time.Since(start), logs.String())
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, want) {
			t.Fatalf("%s: %d, %d bytes, %v; want 200 and the blob", what, resp.StatusCode, len(body), err)
		}
	}
	fetch("warming GET", blobURL(warm.String()), warmData)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := client.Head(blobURL(warm.String()))
		if err == nil {
			_ = resp.Body.Close()
			if resp.Header.Get(mirrorapi.HeaderCache) == mirrorapi.CacheHit {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm blob was not stored within 10 s (%v)", err)
		}
	}

	// 300 clients from 127.0.0.2: GET /v2/, then idle (each waits at most 2 s for its answer).
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 2 * time.Second}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		attacker []net.Conn
	)
	for range 300 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			c, err := d.DialContext(ctx, "tcp", listen)
			if err != nil {
				return
			}
			mu.Lock()
			attacker = append(attacker, c)
			mu.Unlock()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.WriteString(c, "GET /v2/ HTTP/1.1\r\nHost: nodecache\r\n\r\n"); err != nil {
				return
			}
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			_ = c.SetDeadline(time.Time{})
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range attacker {
			_ = c.Close()
		}
	})
	t.Logf("%d attacker connections open", len(attacker))

	fetch("warm blob during the flood", blobURL(warm.String()), warmData)
	fetch("cold blob during the flood", blobURL(cold.String()), coldData)
	resp, err := client.Get(base + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz during the flood: %v %v", resp, err)
	}
	_ = resp.Body.Close()
	if strings.Contains(logs.String(), "too many open files") {
		t.Errorf("serve ran out of descriptors:\n%s", logs.String())
	}
}
