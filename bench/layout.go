package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// writeLayout writes images images straight into distribution's filesystem layout under root,
// in repository repo (tags i0, i1, ...): per image a config, layers layers and an OCI manifest
// referencing them, with revision, tag and layer links as distribution writes them. layer(i)
// gives each layer's size and whether its content is random bytes named by their digest (true)
// or space allocated with fallocate under a random digest (false: fast for GiBs, fine for what
// never reads the content, such as eviction).
func writeLayout(root, repo string, images, layers int, layer func(i int) (int64, bool)) error {
	v2 := filepath.Join(root, "docker/registry/v2")
	repoDir := filepath.Join(v2, "repositories", repo)
	work := make(chan int)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range work {
				if err := writeImage(v2, repoDir, i, layers, layer); err != nil {
					errs <- err
					for range work {
					}
					return
				}
			}
		})
	}
	for i := range images {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

func writeImage(v2, repoDir string, img, layers int, layer func(int) (int64, bool)) error {
	cfg := fmt.Appendf(nil, `{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]},"bench":%d}`, img)
	cd, err := putBlob(v2, cfg)
	if err != nil {
		return err
	}
	m := struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Config        descriptor   `json:"config"`
		Layers        []descriptor `json:"layers"`
	}{2, "application/vnd.oci.image.manifest.v1+json",
		descriptor{"application/vnd.oci.image.config.v1+json", cd, int64(len(cfg))}, nil}
	for l := range layers {
		size, random := layer(img*layers + l)
		var d string
		if random {
			data := make([]byte, size)
			_, _ = rand.Read(data)
			d, err = putBlob(v2, data)
		} else {
			d, err = allocBlob(v2, size)
		}
		if err != nil {
			return err
		}
		m.Layers = append(m.Layers, descriptor{"application/vnd.oci.image.layer.v1.tar+gzip", d, size})
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return err
	}
	md, err := putBlob(v2, mb)
	if err != nil {
		return err
	}
	for _, d := range append([]descriptor{m.Config}, m.Layers...) {
		if err := link(filepath.Join(repoDir, "_layers/sha256", d.Digest[7:], "link"), d.Digest); err != nil {
			return err
		}
	}
	tag := fmt.Sprintf("i%d", img)
	for _, p := range []string{
		filepath.Join(repoDir, "_manifests/revisions/sha256", md[7:], "link"),
		filepath.Join(repoDir, "_manifests/tags", tag, "current/link"),
		filepath.Join(repoDir, "_manifests/tags", tag, "index/sha256", md[7:], "link"),
	} {
		if err := link(p, md); err != nil {
			return err
		}
	}
	return nil
}

func link(path, dgst string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	if err := os.WriteFile(path, []byte(dgst), 0o644); err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	return nil
}

func blobPath(v2, hexDigest string) string {
	return filepath.Join(v2, "blobs/sha256", hexDigest[:2], hexDigest, "data")
}

// putBlob stores data under its digest and returns "sha256:<hex>".
func putBlob(v2 string, data []byte) (string, error) {
	sum := sha256.Sum256(data)
	h := hex.EncodeToString(sum[:])
	p := blobPath(v2, h)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fmt.Errorf("layout: %w", err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		return "", fmt.Errorf("layout: %w", err)
	}
	return "sha256:" + h, nil
}

// allocBlob allocates size bytes under a random digest.
func allocBlob(v2 string, size int64) (string, error) {
	var sum [32]byte
	_, _ = rand.Read(sum[:])
	h := hex.EncodeToString(sum[:])
	p := blobPath(v2, h)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fmt.Errorf("layout: %w", err)
	}
	f, err := os.Create(p)
	if err != nil {
		return "", fmt.Errorf("layout: %w", err)
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return "", fmt.Errorf("layout: fallocate %s: %w", p, err)
	}
	return "sha256:" + h, f.Close()
}
