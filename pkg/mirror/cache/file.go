package cache

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/atomicfile"
	"github.com/nodecache/nodecache/internal/inputfile"
)

const (
	// fileVersion is the format of the index file; a file of another version is not used
	// (ReadFile's error), so the index is rebuilt from storage.
	fileVersion = 1
	// SaveInterval is how often a changed index is written while serving (and once more, clean,
	// at shutdown).
	SaveInterval = time.Minute
)

// File is the on-disk form of the index (JSON), at FilePath of the storage root.
type File struct {
	// Version is fileVersion.
	Version int `json:"version"`
	// Clean is true only when written at shutdown after everything stored was recorded; a file
	// written while serving (every SaveInterval) is false, so after a crash the index is rebuilt
	// from storage, taking its last-pulled times as they were (LastPulled).
	Clean bool `json:"clean"`
	// Written is when the file was written (RFC 3339, UTC).
	Written time.Time `json:"written"`
	// Blobs are the blob data files (manifests included) by digest: size in bytes and when stored.
	Blobs map[digest.Digest]*BlobEntry `json:"blobs"`
	// Repos are the storage repositories ("<upstream key>/<repository>").
	Repos map[string]*RepoFile `json:"repos"`
}

// RepoFile is one storage repository in the index file.
type RepoFile struct {
	Manifests map[digest.Digest]*ManifestEntry `json:"manifests,omitempty"`
	Tags      map[string]digest.Digest         `json:"tags,omitempty"`
	Layers    []digest.Digest                  `json:"layers,omitempty"` // blob links
}

// FilePath is the index file of storage root: <root>/nodecache/index.json; "" (no file) for
// in-memory storage (root "").
func FilePath(root string) string {
	if root == "" {
		return ""
	}
	return filepath.Join(root, "nodecache", "index.json")
}

// Save writes the index to p atomically (a temporary file in the same directory, fsynced, then
// renamed) when it changed since the last save, and always when clean (the shutdown write,
// marked Clean). clock gives the Written time. Nothing is written before the index is ready
// (MarkReady) or when p is "". Errors: encoding or writing the file; the index then stays
// changed, so the next Save tries again.
func (x *Index) Save(p string, clock func() time.Time, clean bool) error {
	if !x.IsReady() || p == "" {
		return nil
	}
	x.mu.Lock()
	if !x.dirty && !clean {
		x.mu.Unlock()
		return nil
	}
	f := File{Version: fileVersion, Clean: clean, Written: clock().UTC(),
		Blobs: map[digest.Digest]*BlobEntry{}, Repos: map[string]*RepoFile{}}
	for d, b := range x.blobs {
		c := *b
		f.Blobs[d] = &c
	}
	for name, r := range x.repos {
		rf := &RepoFile{Manifests: map[digest.Digest]*ManifestEntry{}, Tags: map[string]digest.Digest{}}
		for d, e := range r.manifests {
			c := *e
			rf.Manifests[d] = &c
		}
		for t, d := range r.tags {
			rf.Tags[t] = d
		}
		for d := range r.layers {
			rf.Layers = append(rf.Layers, d)
		}
		f.Repos[name] = rf
	}
	x.dirty = false
	x.mu.Unlock()
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode index: %w", err)
	}
	if err := writeFileAtomic(p, b); err != nil {
		x.mu.Lock()
		x.dirty = true
		x.mu.Unlock()
		return err
	}
	return nil
}

// writeFileAtomic writes b to p (mode 0600, directories 0700) through a temporary file beside
// it, fsynced, then renamed over p.
func writeFileAtomic(p string, b []byte) error { return atomicfile.Write(p, b, atomicfile.Options{}) }

// writeFileSynced is writeFileAtomic, then an fsync of the directory, so the rename itself
// survives a crash (the pins file: a pin is answered only once it is on disk).
func writeFileSynced(p string, b []byte) error {
	return atomicfile.Write(p, b, atomicfile.Options{SyncDir: true})
}

// ReadFile reads the index file at p (through inputfile's size bound). The error says why it
// cannot be used as it is: missing (wraps os.ErrNotExist), too large, corrupt, of another
// version or not written at a clean shutdown; in the last two cases the parsed file is returned
// too, for its last-pulled times (LastPulled) while the index is rebuilt from storage.
func ReadFile(p string) (*File, error) {
	b, err := inputfile.Read(p, inputfile.Index)
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("corrupt: %w", err)
	}
	if f.Version != fileVersion {
		return &f, fmt.Errorf("version %d, want %d", f.Version, fileVersion)
	}
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("corrupt: %w", err)
	}
	if !f.Clean {
		return &f, errors.New("not written at a clean shutdown")
	}
	return &f, nil
}

// check reports what makes f unusable as the index: a null entry, a digest that is not valid
// (digest.Validate: eviction derives storage paths from it), a negative size, a storage
// repository that is not a repository name or a tag that is not a tag (distribution/reference's
// grammar, which storage itself requires: eviction deletes <repository>/_manifests/tags/<tag>,
// so neither may hold ".." or a "/" that leaves its directory).
func (f *File) check() error {
	for d, b := range f.Blobs {
		if err := d.Validate(); err != nil {
			return fmt.Errorf("blob %q: %w", d, err)
		}
		if b == nil || b.Size < 0 {
			return fmt.Errorf("blob %s: want a size of 0 bytes or more, got %v", d, jsonText(b))
		}
	}
	for name, r := range f.Repos {
		if err := checkRepo(name, r); err != nil {
			return fmt.Errorf("repository %q: %w", name, err)
		}
	}
	return nil
}

// checkRepo is check for one storage repository of the file.
func checkRepo(name string, r *RepoFile) error {
	named, err := reference.WithName(name)
	if err != nil {
		return err
	}
	if r == nil {
		return errors.New("null entry")
	}
	for d, e := range r.Manifests {
		if err := d.Validate(); err != nil {
			return fmt.Errorf("manifest %q: %w", d, err)
		}
		if e == nil {
			return fmt.Errorf("manifest %s: null entry", d)
		}
		for _, c := range e.Refs {
			if err := c.Validate(); err != nil {
				return fmt.Errorf("manifest %s: reference %q: %w", d, c, err)
			}
		}
	}
	for tag, d := range r.Tags {
		if _, err := reference.WithTag(named, tag); err != nil {
			return fmt.Errorf("tag %q: %w", tag, err)
		}
		if err := d.Validate(); err != nil {
			return fmt.Errorf("tag %s: digest %q: %w", tag, d, err)
		}
	}
	for _, d := range r.Layers {
		if err := d.Validate(); err != nil {
			return fmt.Errorf("blob link %q: %w", d, err)
		}
	}
	return nil
}

// jsonText is v as JSON, for a message ("null" for a missing entry).
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// LastPulled is manifest d of storage repository repo's last-pulled time in f; zero when f is
// nil or does not have it.
func (f *File) LastPulled(repo string, d digest.Digest) time.Time {
	if f == nil || f.Repos[repo] == nil {
		return time.Time{}
	}
	if e := f.Repos[repo].Manifests[d]; e != nil {
		return e.LastPulled
	}
	return time.Time{}
}

// Fill adds what f records (a file ReadFile accepted) to the index and marks the index changed,
// so the next Save rewrites the file as not clean at once: a crash from then on means a rebuild.
// It does not mark the index ready.
func (x *Index) Fill(f *File) {
	x.mu.Lock()
	for d, b := range f.Blobs {
		if b == nil || x.blobs[d] != nil {
			continue
		}
		c := *b
		c.verified = false // verified by an earlier process: hashed again on its first serve
		x.blobs[d] = &c
		x.size += c.Size
	}
	x.mu.Unlock()
	for name, r := range f.Repos {
		for d, e := range r.Manifests {
			size := int64(0)
			if b := f.Blobs[d]; b != nil {
				size = b.Size
			}
			x.AddManifest(name, d, size, e.Refs, e.LastPulled)
		}
		for t, d := range r.Tags {
			x.SetTag(name, t, d)
		}
		for _, d := range r.Layers {
			x.AddLink(name, d)
		}
	}
	x.mu.Lock()
	x.dirty = true
	x.mu.Unlock()
}
