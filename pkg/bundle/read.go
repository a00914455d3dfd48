// Package bundle reads the image bundles that carry images to a cache that cannot pull them (an
// air-gapped site): a standard OCI image layout (OCI image spec, "OCI Image Layout
// Specification"), as nodecache warm --to, skopeo copy … oci:DIR:TAG and crane pull --format oci
// write it, and a Talos image cache (talosctl images cache-create, siderolabs/talos
// pkg/imager/cache/cache.go) in either of its layouts. Open detects which one a directory holds;
// Reader.Each yields its blobs with their digests checked as they are read.
package bundle

import (
	"context"
	"crypto/sha256"
	_ "crypto/sha512" // sha512 digests (go-digest needs the hash registered)
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Kind is the layout a bundle directory holds (Reader.Kind).
type Kind string

// The layouts Open reads.
const (
	// KindOCILayout is a standard OCI image layout: oci-layout, index.json naming each image,
	// blobs/<algorithm>/<encoded> (OCI image spec, image-layout.md).
	KindOCILayout Kind = "oci-layout"
	// KindTalosFlat is talosctl's --layout flat image cache: blob/sha256-<hex> and
	// manifests/<registry>/<repository>/{reference/<tag>,digest/sha256-<hex>}.
	KindTalosFlat Kind = "talos-flat"
	// KindTalosOCI is talosctl's default --layout oci image cache: an OCI image layout holding
	// one image whose single layer is a tar of the flat tree.
	KindTalosOCI Kind = "talos-oci"
)

// MaxManifestBytes bounds a manifest read from a bundle: what serve accepts from an upstream
// (4 MiB, distribution's own limit for a manifest body).
const MaxManifestBytes = 4 << 20

// ReadOptions configure Open.
type ReadOptions struct {
	// Ref names the images of an OCI image layout whose index.json does not name them in full
	// (nodecache cache import --ref): REGISTRY/REPOSITORY for entries named by a tag alone
	// (skopeo copy … oci:DIR:TAG records only TAG), REGISTRY/REPOSITORY[:TAG] for entries with no
	// name (crane pull --format oci without --annotate-ref). Empty: every entry must carry a full
	// reference in org.opencontainers.image.ref.name. A bundle that needs none is refused with it.
	Ref string
}

// Named is one image a bundle names: the registry and repository it belongs to, its tag ("" for
// an image named by digest alone) and the digest of its top-level manifest (an image manifest or
// an index).
type Named struct {
	// Registry is the registry name as written in image references, lower case, Docker Hub as
	// docker.io (name.Canonical); Repository is as at that registry (Docker Hub's single-component
	// names with their library/ prefix).
	Registry   string
	Repository string
	Tag        string
	Digest     digest.Digest
}

// String is REGISTRY/REPOSITORY[:TAG]@DIGEST.
func (n Named) String() string {
	s := n.Registry + "/" + n.Repository
	if n.Tag != "" {
		s += ":" + n.Tag
	}
	return s + "@" + n.Digest.String()
}

// Manifest is one manifest a bundle holds: its digest, media type (as the manifest or its
// descriptor states it, else sniffed from its shape) and exact bytes.
type Manifest struct {
	Digest    digest.Digest
	MediaType string
	Raw       []byte
}

// Blob is one config or layer blob the images of a bundle reference: digest and size in bytes
// (as their manifests' descriptors state it, which the bundle's file matches).
type Blob struct {
	Digest digest.Digest
	Size   int64
}

// Reader is an opened bundle: every manifest of its images read and checked against its digest,
// every config and layer they reference found in it at the size their descriptors state. Blob
// data is read only by Each and Check.
type Reader struct {
	// Dir is the bundle directory; Kind its layout.
	Dir  string
	Kind Kind
	// Images are the images it names, in the bundle's order.
	Images []Named
	// Manifests are the manifests the images reach that the bundle holds, each once, every
	// child before the index that lists it.
	Manifests []Manifest
	// Blobs are the configs and layers of those manifests, each once.
	Blobs []Blob
	// Absent are the child manifests of an index that the bundle does not hold: the platforms
	// left out of a single-platform bundle (an index is kept whole, its children are optional).
	Absent []digest.Digest

	src blobSource
}

// blobSource is where a layout keeps its blob data.
type blobSource interface {
	// stat returns the size in bytes of blob d's data; an error matching fs.ErrNotExist when the
	// bundle has none.
	stat(d digest.Digest) (int64, error)
	// each calls f for every blob of want the bundle holds, in the layout's own order, with its
	// data; it stops at the first error of f.
	each(ctx context.Context, want map[digest.Digest]bool, f func(d digest.Digest, data io.Reader) error) error
	// path names where blob d is kept, for messages: "blobs/sha256/<hex>".
	path(d digest.Digest) string
}

// manifestLookup returns the bytes of manifest d as a layout keeps them; ok is false when it
// holds none.
type manifestLookup func(d digest.Digest) (raw []byte, ok bool, err error)

// ErrNeedsRef is matched (errors.Is) by Open's refusal of an OCI image layout entry that is
// named by a tag alone or not at all, opened without ReadOptions.Ref.
var ErrNeedsRef = errors.New("the bundle does not name its images")

// ErrDamaged is matched (errors.Is) by every DamageError: the bundle lacks a blob or manifest
// its images need, or holds one that does not match its digest or size.
var ErrDamaged = errors.New("bundle damaged")

// DamageError names what is wrong in a bundle: a missing or damaged blob or manifest.
type DamageError struct {
	// Dir is the bundle; What "blob" or "manifest"; Digest its digest; Of where the bundle's
	// images reference it ("layer 2 of manifest sha256:… of docker.io/library/alpine:3.20");
	// Reason what is wrong ("is missing (want blobs/sha256/…)").
	Dir    string
	What   string
	Digest digest.Digest
	Of     string
	Reason string
}

func (e *DamageError) Error() string {
	of := ""
	if e.Of != "" {
		of = " (" + e.Of + ")"
	}
	return fmt.Sprintf("bundle %s: %s %s%s %s", e.Dir, e.What, e.Digest, of, e.Reason)
}

// Is reports whether target is ErrDamaged.
func (e *DamageError) Is(target error) bool { return target == ErrDamaged }

// Open reads the bundle in dir: an OCI image layout (oci-layout or index.json at its top) or a
// Talos image cache (blob/ and manifests/ at its top, or an OCI image layout whose one image is
// such a tree), detected from what the directory holds.
//
// Errors: a refusal (refusal.ErrRefused) naming what is wrong and what is accepted for a
// directory that is not a bundle, a name Open cannot read, a missing or unneeded opts.Ref; a
// *DamageError (ErrDamaged) for a manifest or blob the images need that is missing, of another
// size than its descriptor states, or (manifests) not matching its digest; an I/O error wrapped
// with the file.
func Open(ctx context.Context, dir string, opts ReadOptions) (*Reader, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, &refusal.Error{Source: "bundle " + dir, Reason: "cannot be read: " + err.Error(), Err: err}
	}
	if !fi.IsDir() {
		return nil, refusal.Errorf("bundle %s is not a directory: %s", dir, acceptedLayouts)
	}
	switch {
	case exists(filepath.Join(dir, "oci-layout")) || exists(filepath.Join(dir, "index.json")):
		return openOCI(ctx, dir, opts)
	case isDir(filepath.Join(dir, talosBlobDir)) && isDir(filepath.Join(dir, talosManifestDir)):
		if opts.Ref != "" {
			return nil, refusal.Errorf("--ref %q: the Talos image cache in %s names its images itself (manifests/<registry>/<repository>/reference/<tag>); drop --ref", opts.Ref, dir)
		}
		return openTalosFlat(ctx, dir)
	}
	return nil, refusal.Errorf("%s is not an image bundle: %s", dir, acceptedLayouts)
}

// acceptedLayouts says what Open reads.
const acceptedLayouts = "want an OCI image layout (oci-layout, index.json and blobs/, as nodecache warm --to, " +
	"skopeo copy … oci:DIR:TAG and crane pull --format oci write it) or a Talos image cache " +
	"(talosctl images cache-create: blob/ and manifests/ with --layout flat, or the OCI image layout holding them)"

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// maxIndexDepth bounds how deep indexes may nest (an index of indexes of images): real ones have
// one level, attestation indexes two.
const maxIndexDepth = 4

// resolver walks the images of a bundle from their top-level manifests.
type resolver struct {
	r      *Reader
	lookup manifestLookup
	seen   map[digest.Digest]bool
	blobs  map[digest.Digest]bool
	absent map[digest.Digest]bool
}

// resolve fills r.Manifests, r.Blobs and r.Absent from r.Images: each top-level manifest is
// read (lookup), checked, and walked; hints are the media types the layout's own descriptors
// state for top-level manifests.
func (r *Reader) resolve(ctx context.Context, lookup manifestLookup, hints map[digest.Digest]string) error {
	rs := &resolver{r: r, lookup: lookup, seen: map[digest.Digest]bool{}, blobs: map[digest.Digest]bool{}, absent: map[digest.Digest]bool{}}
	for _, img := range r.Images {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := rs.visit(img.Digest, hints[img.Digest], -1, "", img.String(), 0); err != nil {
			return err
		}
	}
	for d := range rs.absent {
		if !rs.seen[d] {
			r.Absent = append(r.Absent, d)
		}
	}
	slices.Sort(r.Absent)
	return nil
}

// descriptor is what resolve reads of an OCI descriptor.
type descriptor struct {
	MediaType string        `json:"mediaType"`
	Digest    digest.Digest `json:"digest"`
	Size      int64         `json:"size"`
}

// visit reads and checks manifest d (a descriptor of size bytes, -1: unknown; child tells an
// index's child, which may be absent) and walks what it references; of names it in messages.
func (rs *resolver) visit(d digest.Digest, hint string, size int64, parent digest.Digest, of string, depth int) error {
	if rs.seen[d] {
		return nil
	}
	where := "of " + of
	if parent != "" {
		where = "listed by index " + parent.String() + " of " + of
	}
	if err := d.Validate(); err != nil {
		return refusal.Errorf("bundle %s: manifest digest %q %s: %v", rs.r.Dir, d, where, err)
	}
	raw, ok, err := rs.lookup(d)
	if err != nil {
		return err
	}
	if !ok {
		if parent != "" {
			rs.absent[d] = true // a platform the bundle left out
			return nil
		}
		return &DamageError{Dir: rs.r.Dir, What: "manifest", Digest: d, Of: of, Reason: "is missing"}
	}
	if got := d.Algorithm().FromBytes(raw); got != d {
		return &DamageError{Dir: rs.r.Dir, What: "manifest", Digest: d, Of: of,
			Reason: fmt.Sprintf("does not match its digest: its %d bytes hash to %s", len(raw), got)}
	}
	if size >= 0 && int64(len(raw)) != size {
		return &DamageError{Dir: rs.r.Dir, What: "manifest", Digest: d, Of: of,
			Reason: fmt.Sprintf("is %d bytes; its descriptor says %d", len(raw), size)}
	}
	mt, err := manifestType(hint, raw)
	if err != nil {
		return refusal.Errorf("bundle %s: manifest %s %s: %v", rs.r.Dir, d, where, err)
	}
	rs.seen[d] = true
	if err := rs.walk(d, mt, raw, of, depth); err != nil {
		return err
	}
	rs.r.Manifests = append(rs.r.Manifests, Manifest{Digest: d, MediaType: mt, Raw: raw})
	return nil
}

// walk visits the children of index d, or finds the config and layers of image manifest d in
// the bundle at the sizes its descriptors state.
func (rs *resolver) walk(d digest.Digest, mt string, raw []byte, of string, depth int) error {
	var doc struct {
		Manifests []descriptor `json:"manifests"`
		Config    *descriptor  `json:"config"`
		Layers    []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return refusal.Errorf("bundle %s: manifest %s of %s: %v", rs.r.Dir, d, of, err)
	}
	if isIndex(mt) {
		if depth >= maxIndexDepth {
			return refusal.Errorf("bundle %s: index %s of %s nests indexes deeper than %d levels", rs.r.Dir, d, of, maxIndexDepth)
		}
		for _, c := range doc.Manifests {
			if err := rs.visit(c.Digest, c.MediaType, c.Size, d, of, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if doc.Config == nil {
		return refusal.Errorf("bundle %s: manifest %s of %s has no config", rs.r.Dir, d, of)
	}
	if err := rs.blob(*doc.Config, fmt.Sprintf("config of manifest %s of %s", d, of)); err != nil {
		return err
	}
	for i, l := range doc.Layers {
		if err := rs.blob(l, fmt.Sprintf("layer %d of manifest %s of %s", i+1, d, of)); err != nil {
			return err
		}
	}
	return nil
}

// blob finds the blob of desc in the bundle, at desc's size.
func (rs *resolver) blob(desc descriptor, of string) error {
	if err := desc.Digest.Validate(); err != nil {
		return refusal.Errorf("bundle %s: %s: digest %q: %v", rs.r.Dir, of, desc.Digest, err)
	}
	if !desc.Digest.Algorithm().Available() {
		return refusal.Errorf("bundle %s: %s: digest algorithm %s: want sha256 or sha512", rs.r.Dir, of, desc.Digest.Algorithm())
	}
	if rs.blobs[desc.Digest] {
		return nil
	}
	size, err := rs.r.src.stat(desc.Digest)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &DamageError{Dir: rs.r.Dir, What: "blob", Digest: desc.Digest, Of: of, Reason: "is missing (want " + rs.r.src.path(desc.Digest) + ")"}
	case err != nil:
		return err
	case size != desc.Size:
		return &DamageError{Dir: rs.r.Dir, What: "blob", Digest: desc.Digest, Of: of,
			Reason: fmt.Sprintf("is %d bytes (%s); its descriptor says %d", size, rs.r.src.path(desc.Digest), desc.Size)}
	}
	rs.blobs[desc.Digest] = true
	rs.r.Blobs = append(rs.r.Blobs, Blob{Digest: desc.Digest, Size: size})
	return nil
}

// manifestType is the media type of manifest raw: the one it states itself, else hint (its
// descriptor's), else sniffed from its shape (an index lists manifests, an image manifest has a
// config and layers), as a Talos image cache, which stores no media types, needs. Accepted are
// the OCI image manifest and index and the Docker schema 2 manifest and manifest list.
func manifestType(hint string, raw []byte) (string, error) {
	var doc struct {
		MediaType     string          `json:"mediaType"`
		SchemaVersion *int            `json:"schemaVersion"`
		Manifests     json.RawMessage `json:"manifests"`
		Config        json.RawMessage `json:"config"`
		Layers        json.RawMessage `json:"layers"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("not a JSON manifest: %w", err)
	}
	mt := doc.MediaType
	switch {
	case doc.SchemaVersion != nil && *doc.SchemaVersion == 1:
		return "", errors.New("a Docker schema 1 manifest: want an OCI or Docker schema 2 manifest or index (schema 1 is not served by nodecache)")
	case mt != "":
	case hint != "":
		mt = hint
	case doc.Manifests != nil:
		mt = mirrorapi.MediaTypeOCIIndex
	case doc.Config != nil && doc.Layers != nil:
		mt = mirrorapi.MediaTypeOCIManifest
	}
	switch mt {
	case mirrorapi.MediaTypeOCIIndex, mirrorapi.MediaTypeOCIManifest, mirrorapi.MediaTypeDockerList, mirrorapi.MediaTypeDockerManifest:
		return mt, nil
	case "":
		return "", errors.New("no mediaType, and neither manifests nor config and layers: not a manifest")
	}
	return "", fmt.Errorf("media type %q: want an OCI or Docker schema 2 manifest or index", mt)
}

func isIndex(mt string) bool {
	return mt == mirrorapi.MediaTypeOCIIndex || mt == mirrorapi.MediaTypeDockerList
}

// Each calls f for every blob of r.Blobs that want accepts (nil: every one), in the bundle's own
// order, with its data: a reader that answers a *DamageError instead of io.EOF when the data is
// not the blob's size or does not hash to its digest. What f leaves unread is read (and checked)
// after it returns. It stops at the first error of f, of the check, or of ctx.
//
// Errors: f's; a *DamageError (ErrDamaged) for a blob whose data is damaged or gone since Open;
// an I/O error.
func (r *Reader) Each(ctx context.Context, want func(Blob) bool, f func(b Blob, data io.Reader) error) error {
	sizes := map[digest.Digest]int64{}
	set := map[digest.Digest]bool{}
	for _, b := range r.Blobs {
		if want == nil || want(b) {
			sizes[b.Digest], set[b.Digest] = b.Size, true
		}
	}
	done := map[digest.Digest]bool{}
	err := r.src.each(ctx, set, func(d digest.Digest, data io.Reader) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if done[d] {
			return nil
		}
		done[d] = true
		b := Blob{Digest: d, Size: sizes[d]}
		vr := r.verifier(b, data)
		if err := f(b, vr); err != nil {
			return err
		}
		_, err := io.Copy(io.Discard, vr)
		return err
	})
	if err != nil {
		return err
	}
	for _, b := range r.Blobs {
		if set[b.Digest] && !done[b.Digest] {
			return &DamageError{Dir: r.Dir, What: "blob", Digest: b.Digest, Reason: "is missing (gone since the bundle was opened; want " + r.src.path(b.Digest) + ")"}
		}
	}
	return nil
}

// Check reads every blob of r.Blobs that want accepts (nil: every one) and hashes it. Errors:
// every damaged blob's *DamageError, joined (ErrDamaged), or the first I/O error.
func (r *Reader) Check(ctx context.Context, want func(Blob) bool) error {
	var damaged []error
	err := r.Each(ctx, want, func(_ Blob, data io.Reader) error {
		_, err := io.Copy(io.Discard, data)
		var de *DamageError
		if errors.As(err, &de) {
			damaged = append(damaged, de)
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	return errors.Join(damaged...)
}

// verifier is data as a reader that checks, at its end, that blob b's data is b.Size bytes and
// hashes to b.Digest.
func (r *Reader) verifier(b Blob, data io.Reader) io.Reader {
	return &verifyReader{r: data, b: b, dir: r.Dir, path: r.src.path(b.Digest), h: b.Digest.Algorithm().Hash()}
}

type verifyReader struct {
	r    io.Reader
	b    Blob
	dir  string
	path string
	h    hash.Hash
	n    int64
	done error
}

func (v *verifyReader) Read(p []byte) (int, error) {
	if v.done != nil {
		return 0, v.done
	}
	n, err := v.r.Read(p)
	v.n += int64(n)
	_, _ = v.h.Write(p[:n])
	if v.n > v.b.Size {
		v.done = &DamageError{Dir: v.dir, What: "blob", Digest: v.b.Digest, Reason: fmt.Sprintf("is longer than its %d bytes (%s)", v.b.Size, v.path)}
		return n, v.done
	}
	if errors.Is(err, io.EOF) {
		v.done = v.verdict()
		return n, v.done
	}
	return n, err
}

// verdict is io.EOF when the whole data matched, else the *DamageError saying how it did not.
func (v *verifyReader) verdict() error {
	if v.n != v.b.Size {
		return &DamageError{Dir: v.dir, What: "blob", Digest: v.b.Digest, Reason: fmt.Sprintf("is %d bytes (%s); its descriptor says %d", v.n, v.path, v.b.Size)}
	}
	if got := digest.NewDigestFromBytes(v.b.Digest.Algorithm(), v.h.Sum(nil)); got != v.b.Digest {
		return &DamageError{Dir: v.dir, What: "blob", Digest: v.b.Digest, Reason: fmt.Sprintf("does not match its digest: its %d bytes hash to %s (%s)", v.n, got, v.path)}
	}
	return io.EOF
}

// Plan is what serve needs to import r (mirrorapi.CacheImportPath): its images, every manifest
// with its bytes, every blob with its size.
func (r *Reader) Plan() mirrorapi.ImportPlan {
	p := mirrorapi.ImportPlan{Images: []mirrorapi.ImportImage{}, Manifests: []mirrorapi.ImportManifest{}, Blobs: []mirrorapi.ImportBlob{}}
	for _, i := range r.Images {
		p.Images = append(p.Images, mirrorapi.ImportImage{Upstream: i.Registry, Repository: i.Repository, Tag: i.Tag, Digest: i.Digest.String()})
	}
	for _, m := range r.Manifests {
		p.Manifests = append(p.Manifests, mirrorapi.ImportManifest{Digest: m.Digest.String(), MediaType: m.MediaType, Raw: m.Raw})
	}
	for _, b := range r.Blobs {
		p.Blobs = append(p.Blobs, mirrorapi.ImportBlob{Digest: b.Digest.String(), Size: b.Size})
	}
	return p
}

// readManifestFile reads the manifest file p, at most MaxManifestBytes; ok is false when there
// is none.
func readManifestFile(p string) ([]byte, bool, error) {
	// inputfile stats before it opens: a named pipe in a manifest's place is refused, never
	// opened, so it cannot block the import (opening a FIFO waits for a writer).
	raw, err := inputfile.Read(p, inputfile.Kind{Name: "a manifest (serve refuses larger ones)", Limit: MaxManifestBytes})
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, false, nil
	case inputfile.Refused(err):
		return nil, false, err
	case err != nil:
		return nil, false, fmt.Errorf("read %s: %w", p, err)
	}
	return raw, true, nil
}

// sha256Of is the sha256 digest of raw (the only algorithm a Talos image cache names files by).
func sha256Of(raw []byte) digest.Digest {
	sum := sha256.Sum256(raw)
	return digest.NewDigestFromBytes(digest.SHA256, sum[:])
}
