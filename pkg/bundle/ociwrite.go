package bundle

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// The files of an OCI image layout (image-spec v1.1 image-layout.md).
const (
	OCILayoutFile = specs.ImageLayoutFile // "oci-layout"
	OCIIndexFile  = "index.json"
	OCIBlobsDir   = specs.ImageBlobsDir // "blobs"
)

// AnnotationContainerdName is containerd's image name annotation: `ctr images export` writes it
// beside org.opencontainers.image.ref.name and `ctr images import` prefers it. The OCI writer
// sets both to the image's full reference.
const AnnotationContainerdName = "io.containerd.image.name"

// The index.json and oci-layout files a writer reads back from an existing layout, and their
// bounds: an index of tens of thousands of images is far below 64 MiB.
var (
	ociIndexKind  = inputfile.Kind{Name: "an OCI image index (index.json)", Limit: 64 * inputfile.MiB}
	ociLayoutKind = inputfile.Kind{Name: `an oci-layout file ({"imageLayoutVersion": "1.0.0"})`, Limit: 4 * inputfile.KiB}
)

// ociWriter writes an OCI image layout: blobs and manifests under blobs/<algorithm>/<hex>,
// index.json last. In a new layout oci-layout is written first, so that what an interrupted
// run leaves is known as a layout without index.json and resumed.
type ociWriter struct {
	dir string
	// index is the existing index.json's fields, "manifests" apart; entries its manifests.
	// Both nil for a layout without index.json.
	index   map[string]json.RawMessage
	entries []json.RawMessage
	fresh   bool // no oci-layout file yet
}

// openOCIWriter checks what DIR holds (entries) for an OCI image layout writer: nothing, or an OCI
// image layout (oci-layout of version 1.0.0, index.json, if present, an image index).
func openOCIWriter(dir string, entries []fs.DirEntry) (*ociWriter, bool, error) {
	l := &ociWriter{dir: dir}
	if len(entries) == 0 {
		l.fresh = true
		return l, false, nil
	}
	has := map[string]bool{}
	for _, e := range entries {
		has[e.Name()] = true
	}
	if !has[OCILayoutFile] {
		if isTalosTree(entries) {
			return nil, false, refusal.Errorf("--to %s holds a Talos flat image cache (blob/, manifests/), not an OCI image layout: add to it with --format talos-flat, or give another directory", dir)
		}
		return nil, false, refusal.Errorf("--to %s is not empty and is not an OCI image layout (no %s file; it holds %s): want a new or empty directory, or an OCI image layout to add to", dir, OCILayoutFile, describeEntries(entries))
	}
	p := filepath.Join(dir, OCILayoutFile)
	b, err := inputfile.Read(p, ociLayoutKind)
	if err != nil {
		return nil, false, refuseFile(dir, p, err)
	}
	var lf specs.ImageLayout
	if err := json.Unmarshal(b, &lf); err != nil || lf.Version != specs.ImageLayoutVersion {
		return nil, false, refusal.Errorf("--to %s: %s is not an OCI image layout version %s file (%q): want a new or empty directory, or an OCI image layout to add to", dir, p, specs.ImageLayoutVersion, truncate(b, 64))
	}
	p = filepath.Join(dir, OCIIndexFile)
	b, err = inputfile.Read(p, ociIndexKind)
	if errors.Is(err, fs.ErrNotExist) {
		return l, false, nil // what an interrupted writer leaves: resumed
	}
	if err != nil {
		return nil, false, refuseFile(dir, p, err)
	}
	if err := json.Unmarshal(b, &l.index); err != nil {
		return nil, false, refusal.Errorf("--to %s: %s is not JSON (%v): want an OCI image index; remove the directory or give another", dir, p, err)
	}
	if raw, ok := l.index["manifests"]; ok {
		if err := json.Unmarshal(raw, &l.entries); err != nil {
			return nil, false, refusal.Errorf("--to %s: %s has no list of manifests (%v): want an OCI image index; remove the directory or give another", dir, p, err)
		}
	}
	delete(l.index, "manifests")
	return l, true, nil
}

// refuseFile turns the failure to read a file of an existing bundle into a refusal of --to.
func refuseFile(dir, p string, err error) error {
	if inputfile.Refused(err) {
		return refusal.Errorf("--to %s: %v", dir, err)
	}
	return fmt.Errorf("--to %s: read %s: %w", dir, p, err)
}

// truncate returns at most n bytes of b, for a message.
func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

func (l *ociWriter) start(w *Writer) error {
	if !l.fresh {
		return nil
	}
	b, err := json.Marshal(specs.ImageLayout{Version: specs.ImageLayoutVersion})
	if err != nil {
		return fmt.Errorf("encode %s: %w", OCILayoutFile, err)
	}
	return w.writeFileAtomic(filepath.Join(l.dir, OCILayoutFile), b)
}

func (l *ociWriter) blobPath(d digest.Digest) (string, error) {
	return filepath.Join(l.dir, OCIBlobsDir, d.Algorithm().String(), d.Encoded()), nil
}

// putManifest stores a manifest as a blob (image-spec image-layout.md: manifests are blobs).
func (l *ociWriter) putManifest(w *Writer, _, _ string, d digest.Digest, body []byte) error {
	p, _ := l.blobPath(d)
	if err := w.writeFileAtomic(p, body); err != nil {
		return fmt.Errorf("store manifest %s: %w", d, err)
	}
	w.mu.Lock()
	w.verified[d] = true
	w.markSynced(filepath.Dir(p))
	w.mu.Unlock()
	return nil
}

// commit writes index.json: the entries of the existing index.json but those listed under a
// name written now, then one entry per image — its manifest's media type, digest and size,
// with org.opencontainers.image.ref.name and io.containerd.image.name both the image's full
// reference (Image.Name).
func (l *ociWriter) commit(w *Writer, images []Image) error {
	names := map[string]bool{}
	for _, im := range images {
		names[im.Name()] = true
	}
	var manifests []json.RawMessage
	for _, raw := range l.entries {
		var e struct {
			Annotations map[string]string `json:"annotations"`
		}
		if json.Unmarshal(raw, &e) == nil && names[e.Annotations[specs.AnnotationRefName]] {
			continue // replaced by the image written now
		}
		manifests = append(manifests, raw)
	}
	for _, im := range images {
		desc := v1.Descriptor{
			MediaType: im.Manifest.MediaType, Digest: im.Manifest.Digest, Size: im.Manifest.Size,
			Annotations: map[string]string{specs.AnnotationRefName: im.Name(), AnnotationContainerdName: im.Name()},
		}
		raw, err := json.Marshal(desc)
		if err != nil {
			return fmt.Errorf("encode index entry %s: %w", im.Name(), err)
		}
		manifests = append(manifests, raw)
	}
	index := map[string]any{}
	for k, v := range l.index {
		index[k] = v
	}
	index["schemaVersion"] = 2
	if _, ok := index["mediaType"]; !ok {
		index["mediaType"] = types.OCIImageIndex
	}
	if manifests == nil {
		manifests = []json.RawMessage{}
	}
	index["manifests"] = manifests
	b, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", OCIIndexFile, err)
	}
	if err := w.writeFileAtomic(filepath.Join(l.dir, OCIIndexFile), append(b, '\n')); err != nil {
		return err
	}
	return syncDir(l.dir)
}

// isTalosTree reports whether entries are those of a Talos flat image cache: only blob/ and
// manifests/ directories.
func isTalosTree(entries []fs.DirEntry) bool {
	if len(entries) == 0 {
		return false
	}
	for _, e := range entries {
		if !e.IsDir() || (e.Name() != flatBlobDir && e.Name() != flatManifestsDir) {
			return false
		}
	}
	return true
}
