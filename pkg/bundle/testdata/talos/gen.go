//go:build ignore

// gen writes the Talos image cache fixtures beside it, flat/ and oci/, by the rules of talosctl
// images cache-create (siderolabs/talos pkg/imager/cache/cache.go; see README.md), with the
// standard library only: nothing of nodecache's own bundle writer. Run from this directory:
//
//	go run gen.go
//
// The output is committed; running it again writes the same bytes.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// files is the flat tree: path → content.
var files = map[string][]byte{}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// blob puts b under blob/ as cache.go names it ("sha256:" written "sha256-") and returns its digest.
func blob(b []byte) string {
	d := sha(b)
	files["blob/"+strings.Replace(d, "sha256:", "sha256-", 1)] = b
	return d
}

// manifest puts raw under manifests/<regDir>/<repo>/digest/sha256-<hex> and, with a tag, under
// reference/<tag>; it returns its digest.
func manifest(regDir, repo, tag string, raw []byte) string {
	d := sha(raw)
	base := "manifests/" + regDir + "/" + repo + "/"
	files[base+"digest/"+strings.Replace(d, "sha256:", "sha256-", 1)] = raw
	if tag != "" {
		files[base+"reference/"+tag] = raw
	}
	return d
}

// layer is a gzip-compressed tar of one file; it returns the compressed bytes and the diff ID
// (digest of the tar).
func layer(name, content string) ([]byte, string) {
	var t bytes.Buffer
	tw := tar.NewWriter(&t)
	must(tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}))
	_, err := tw.Write([]byte(content))
	must(err)
	must(tw.Close())
	return gz(t.Bytes()), sha(t.Bytes())
}

func gz(b []byte) []byte {
	var z bytes.Buffer
	zw, err := gzip.NewWriterLevel(&z, gzip.BestCompression)
	must(err)
	_, err = zw.Write(b)
	must(err)
	must(zw.Close())
	return z.Bytes()
}

func config(arch string, diffIDs ...string) []byte {
	return js(map[string]any{"architecture": arch, "os": "linux",
		"config": map[string]any{"Cmd": []string{"/hello.txt"}}, "rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs}})
}

func js(v any) []byte {
	b, err := json.Marshal(v)
	must(err)
	return b
}

func desc(mt string, b []byte, digest string, extra map[string]any) map[string]any {
	d := map[string]any{"mediaType": mt, "digest": digest, "size": len(b)}
	for k, v := range extra {
		d[k] = v
	}
	return d
}

const (
	ociManifest  = "application/vnd.oci.image.manifest.v1+json"
	ociIndex     = "application/vnd.oci.image.index.v1+json"
	ociConfig    = "application/vnd.oci.image.config.v1+json"
	ociLayer     = "application/vnd.oci.image.layer.v1.tar+gzip"
	dockerMan    = "application/vnd.docker.distribution.manifest.v2+json"
	dockerConfig = "application/vnd.docker.container.image.v1+json"
	dockerLayer  = "application/vnd.docker.image.rootfs.diff.tar.gzip"
)

func main() {
	shared, sharedID := layer("hello.txt", "hello from a layer two images share\n")
	app, appID := layer("app.txt", "the app of upstream.test:5000/team/app:v1\n")
	sharedD, appD := blob(shared), blob(app)

	// upstream.test:5000/team/app:v1, an index of linux/amd64 and linux/arm64 cached for
	// linux/amd64 (processImage: the index under reference/ and digest/, the platform's manifest
	// under digest/, the other platform absent). The amd64 manifest states no mediaType (an OCI
	// manifest may leave it out): the reader sniffs it.
	cfg := config("amd64", sharedID, appID)
	amd64 := js(map[string]any{"schemaVersion": 2,
		"config": desc(ociConfig, cfg, blob(cfg), nil),
		"layers": []any{desc(ociLayer, shared, sharedD, nil), desc(ociLayer, app, appD, nil)}})
	armCfg := config("arm64", sharedID)
	arm64 := js(map[string]any{"schemaVersion": 2, "mediaType": ociManifest,
		"config": desc(ociConfig, armCfg, sha(armCfg), nil), "layers": []any{desc(ociLayer, shared, sharedD, nil)}})
	index := js(map[string]any{"schemaVersion": 2, "mediaType": ociIndex, "manifests": []any{
		desc(ociManifest, amd64, sha(amd64), map[string]any{"platform": map[string]string{"architecture": "amd64", "os": "linux"}}),
		desc(ociManifest, arm64, sha(arm64), map[string]any{"platform": map[string]string{"architecture": "arm64", "os": "linux"}}),
	}})
	manifest("upstream.test_5000_", "team/app", "", amd64)
	manifest("upstream.test_5000_", "team/app", "v1", index)

	// upstream.test:5000/team/tool@sha256:…, cached by digest alone: digest/ only.
	toolCfg := config("amd64", sharedID)
	tool := js(map[string]any{"schemaVersion": 2, "mediaType": ociManifest,
		"config": desc(ociConfig, toolCfg, blob(toolCfg), nil), "layers": []any{desc(ociLayer, shared, sharedD, nil)}})
	manifest("upstream.test_5000_", "team/tool", "", tool)

	// docker.io/library/busybox:1.36, a Docker schema 2 manifest (no index): Docker Hub's
	// registry directory is docker.io (rewriteRegistry).
	bbCfg := config("amd64", sharedID)
	busybox := js(map[string]any{"schemaVersion": 2, "mediaType": dockerMan,
		"config": desc(dockerConfig, bbCfg, blob(bbCfg), nil), "layers": []any{desc(dockerLayer, shared, sharedD, nil)}})
	manifest("docker.io", "library/busybox", "1.36", busybox)

	writeTree("flat", files)
	writeOCI("oci")
	fmt.Println("index", sha(index), "amd64", sha(amd64), "arm64", sha(arm64), "tool", sha(tool), "busybox", sha(busybox))
}

func writeTree(dir string, tree map[string][]byte) {
	must(os.RemoveAll(dir))
	for p, b := range tree {
		full := filepath.Join(dir, filepath.FromSlash(p))
		must(os.MkdirAll(filepath.Dir(full), 0o755))
		must(os.WriteFile(full, b, 0o644))
	}
}

// writeOCI writes the --layout oci form: an OCI image layout of one image (the platform set, no
// ref.name) whose single layer is a gzip-compressed tar of the flat tree, directories included,
// entries sorted by path (filemap.Walk and filemap.Layer).
func writeOCI(dir string) {
	entries := map[string]bool{}
	for p := range files {
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			entries[filepath.ToSlash(d)] = true
		}
	}
	var names []string
	for p := range files {
		names = append(names, p)
	}
	for d := range entries {
		names = append(names, d)
	}
	sort.Strings(names)
	var t bytes.Buffer
	tw := tar.NewWriter(&t)
	for _, n := range names {
		if entries[n] {
			must(tw.WriteHeader(&tar.Header{Name: n, Mode: 0o755, Typeflag: tar.TypeDir}))
			continue
		}
		must(tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}))
		_, err := tw.Write(files[n])
		must(err)
	}
	must(tw.Close())
	layer := gz(t.Bytes())
	cfg := js(map[string]any{"architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
		"config": map[string]any{}, "rootfs": map[string]any{"type": "layers", "diff_ids": []string{sha(t.Bytes())}}})
	man := js(map[string]any{"schemaVersion": 2, "mediaType": ociManifest,
		"config": desc(ociConfig, cfg, sha(cfg), nil), "layers": []any{desc(ociLayer, layer, sha(layer), nil)}})
	out := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": js(map[string]any{"schemaVersion": 2, "mediaType": ociIndex, "manifests": []any{
			desc(ociManifest, man, sha(man), map[string]any{"platform": map[string]string{"architecture": "amd64", "os": "linux"}})}}),
	}
	for _, b := range [][]byte{layer, cfg, man} {
		out["blobs/sha256/"+strings.TrimPrefix(sha(b), "sha256:")] = b
	}
	writeTree(dir, out)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
