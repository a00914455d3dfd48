package faults

import (
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/internal/runtimetest"
)

// blobsDir is distribution's blob store under a filesystem root:
// <root>/docker/registry/v2/blobs/<algorithm>/<first two hex>/<hex>/data.
func blobsDir(root string) string { return filepath.Join(root, "docker", "registry", "v2", "blobs") }

// dataPath is blob d's data file under root.
func dataPath(root string, d v1.Hash) string {
	return filepath.Join(blobsDir(root), d.Algorithm, d.Hex[:2], d.Hex, "data")
}

// corrupt is a stored blob whose bytes do not hash to the digest it is stored under.
type corrupt struct {
	// digest is the one it is stored under; what says what its bytes are.
	digest, what string
}

// rehash reads every blob stored under root (manifests are blobs there too) and returns those
// whose bytes do not hash to the digest they are stored under, and how many it read. A blob
// removed during the walk (evicted) is not an error.
func rehash(root string) ([]corrupt, int, error) {
	var bad []corrupt
	n := 0
	err := filepath.WalkDir(blobsDir(root), func(path string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if e.IsDir() || e.Name() != "data" {
			return nil
		}
		rel, _ := filepath.Rel(blobsDir(root), path)
		parts := strings.Split(filepath.ToSlash(rel), "/")
		if len(parts) != 4 {
			return nil
		}
		var h hash.Hash
		switch parts[0] {
		case "sha256":
			h = sha256.New()
		case "sha512":
			h = sha512.New()
		default:
			return nil
		}
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		defer f.Close()
		size, err := io.Copy(h, f)
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		n++
		if got := fmt.Sprintf("%x", h.Sum(nil)); got != parts[2] {
			d := parts[0] + ":" + parts[2]
			bad = append(bad, corrupt{digest: d, what: fmt.Sprintf("%s stored with %d bytes of %s:%s", d, size, parts[0], got)})
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return bad, n, err
}

// damage is how a stored blob is damaged on disk.
type damage string

const (
	damageFlip     damage = "flip"     // one byte flipped, same length
	damageTruncate damage = "truncate" // the last 100 bytes cut off
	damageEmpty    damage = "empty"    // 0 bytes
)

// damageBlob damages the data file at path in place (the file stays the same inode, as disk
// corruption leaves it); off is where a flip happens.
func damageBlob(path string, how damage, off int64) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	switch how {
	case damageFlip:
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, off); err != nil {
			return err
		}
		b[0] ^= 0x5a
		_, err = f.WriteAt(b, off)
		return err
	case damageTruncate:
		return os.Truncate(path, max(0, fi.Size()-100))
	default:
		return os.Truncate(path, 0)
	}
}

// tmpfs mounts a tmpfs of size bytes on a new directory for the test (the full-disk kind's
// root). It needs root (CI runs as root): without it the test is skipped saying so, or fails
// with CI=true (runtimetest.Unavailable).
func tmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		runtimetest.Unavailable(t, "the full-disk kind mounts a tmpfs as serve's root, which needs root (CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// fill writes a file at path that leaves free bytes (about: tmpfs counts pages) free on its
// file system, and returns the bytes actually free after it.
func fill(path string, free int64) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, err
	}
	avail := int64(st.Bavail) * st.Bsize
	if avail > free {
		f, err := os.Create(path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		chunk := make([]byte, 64<<10)
		for left := avail - free; left > 0; {
			n := min(left, int64(len(chunk)))
			if _, err := f.Write(chunk[:n]); err != nil {
				return 0, err
			}
			left -= n
		}
		if err := f.Sync(); err != nil {
			return 0, err
		}
	}
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}
