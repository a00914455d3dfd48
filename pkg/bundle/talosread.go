package bundle

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// A Talos image cache, as talosctl images cache-create writes it (siderolabs/talos
// pkg/imager/cache/cache.go, Generate and processImage): every config and layer blob once in
// blob/, named by its digest with "sha256:" written "sha256-" (processLayer, cacheImage); for
// each image, under manifests/<registry>/<repository>/, the manifest its reference resolves to
// (an index for a multi-platform image) in reference/<tag> when the reference has a tag, and in
// digest/sha256-<hex>, and the platform's image manifest in digest/sha256-<hex> (cacheImage).
// The registry directory is the reference's registry with a port written "_port_" (host:5000 is
// host_5000_, for vfat media) and Docker Hub as docker.io (rewriteRegistry). No media type is
// stored: manifestType sniffs it. With --layout flat that tree is the directory; with the
// default --layout oci, an OCI image layout holds one image (no ref.name, the platform set)
// whose single layer is a tar of the tree (filemap.Layer, gzip-compressed, entries sorted by
// path).
const (
	talosBlobDir     = "blob"
	talosManifestDir = "manifests"
)

// talosTree is a Talos image cache's manifests/ tree as read: every manifest by digest, and per
// repository its tags and the manifests under digest/.
type talosTree struct {
	dir       string
	repos     map[string]*talosRepo // by "<registry>/<repository>"
	manifests map[digest.Digest][]byte
}

// talosRepo is one repository of a talosTree.
type talosRepo struct {
	registry, repository string
	tags                 map[string]digest.Digest
	digests              []digest.Digest
}

func newTalosTree(dir string) *talosTree {
	return &talosTree{dir: dir, repos: map[string]*talosRepo{}, manifests: map[digest.Digest][]byte{}}
}

// lookup is the tree's manifestLookup.
func (t *talosTree) lookup(d digest.Digest) ([]byte, bool, error) {
	raw, ok := t.manifests[d]
	return raw, ok, nil
}

// talosPathForm is the path of a manifest file a Talos image cache holds.
const talosPathForm = "want manifests/<registry>/<repository>/reference/<tag> or manifests/<registry>/<repository>/digest/sha256-<hex> (talosctl images cache-create)"

// add records the manifest file rel ("/"-separated, under manifests/) holding raw.
func (t *talosTree) add(rel string, raw []byte) error {
	parts := strings.Split(rel, "/")
	n := len(parts)
	if n < 4 || (parts[n-2] != "reference" && parts[n-2] != "digest") {
		return refusal.Errorf("bundle %s: manifests/%s: %s", t.dir, rel, talosPathForm)
	}
	repo, err := t.repo(parts[0], strings.Join(parts[1:n-2], "/"), rel)
	if err != nil {
		return err
	}
	file := parts[n-1]
	if parts[n-2] == "reference" {
		if !tagOnly.MatchString(file) {
			return refusal.Errorf("bundle %s: manifests/%s: %q is not a tag: %s", t.dir, rel, file, talosPathForm)
		}
		d := sha256Of(raw)
		repo.tags[file] = d
		t.manifests[d] = raw
		return nil
	}
	d, ok := talosDigest(file)
	if !ok {
		return refusal.Errorf("bundle %s: manifests/%s: %q is not sha256-<64 hex digits>: %s", t.dir, rel, file, talosPathForm)
	}
	if got := sha256Of(raw); got != d {
		return &DamageError{Dir: t.dir, What: "manifest", Digest: d, Of: "manifests/" + rel,
			Reason: fmt.Sprintf("does not match its digest: its %d bytes hash to %s", len(raw), got)}
	}
	repo.digests = append(repo.digests, d)
	t.manifests[d] = raw
	return nil
}

// repo returns the repository of registry directory regDir and repository path p, made when new.
func (t *talosTree) repo(regDir, p, rel string) (*talosRepo, error) {
	reg, err := talosRegistry(regDir)
	if err != nil {
		return nil, refusal.Errorf("bundle %s: manifests/%s: registry directory %q: %v", t.dir, rel, regDir, err)
	}
	spec, _, ok, err := fullRef(reg + "/" + p)
	if !ok || err != nil {
		return nil, refusal.Errorf("bundle %s: manifests/%s: repository %q is not a repository name: %v", t.dir, rel, p, err)
	}
	k := spec.registry + "/" + spec.repository
	if r := t.repos[k]; r != nil {
		return r, nil
	}
	r := &talosRepo{registry: spec.registry, repository: spec.repository, tags: map[string]digest.Digest{}}
	t.repos[k] = r
	return r, nil
}

// talosRegistry turns a registry directory back into the registry name: "host_5000_" is
// "host:5000" (cache.go's rewriteRegistry writes ":port" as "_port_").
func talosRegistry(dir string) (string, error) {
	n := dir
	if body, ok := strings.CutSuffix(n, "_"); ok {
		if i := strings.LastIndexByte(body, '_'); i > 0 && isDigits(body[i+1:]) {
			n = body[:i] + ":" + body[i+1:]
		}
	}
	return name.ParseRegistry(n)
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// talosDigest parses a file name "sha256-<hex>".
func talosDigest(file string) (digest.Digest, bool) {
	enc, ok := strings.CutPrefix(file, "sha256-")
	d := digest.NewDigestFromEncoded(digest.SHA256, enc)
	return d, ok && d.Validate() == nil
}

// images names the tree's images: every tag, and every manifest under digest/ that no other
// manifest of its repository lists and no tag names (an image cached by digest alone).
func (t *talosTree) images() ([]Named, error) {
	var out []Named
	for _, k := range slices.Sorted(maps.Keys(t.repos)) {
		r := t.repos[k]
		tagged := map[digest.Digest]bool{}
		for _, tag := range slices.Sorted(maps.Keys(r.tags)) {
			out = append(out, Named{Registry: r.registry, Repository: r.repository, Tag: tag, Digest: r.tags[tag]})
			tagged[r.tags[tag]] = true
		}
		children := map[digest.Digest]bool{}
		for _, d := range r.digests {
			for _, c := range childManifests(t.manifests[d]) {
				children[c] = true
			}
		}
		for _, d := range r.tags {
			for _, c := range childManifests(t.manifests[d]) {
				children[c] = true
			}
		}
		slices.Sort(r.digests)
		for _, d := range slices.Compact(r.digests) {
			if !tagged[d] && !children[d] {
				out = append(out, Named{Registry: r.registry, Repository: r.repository, Digest: d})
			}
		}
	}
	if len(out) == 0 {
		return nil, refusal.Errorf("bundle %s: the Talos image cache holds no image (manifests/ is empty)", t.dir)
	}
	return out, nil
}

// childManifests lists the digests an index's manifests name (none for anything else).
func childManifests(raw []byte) []digest.Digest {
	var doc struct {
		Manifests []descriptor `json:"manifests"`
	}
	if json.Unmarshal(raw, &doc) != nil {
		return nil
	}
	out := make([]digest.Digest, 0, len(doc.Manifests))
	for _, m := range doc.Manifests {
		out = append(out, m.Digest)
	}
	return out
}

// sortedDigests returns the keys of set, sorted.
func sortedDigests(set map[digest.Digest]bool) []digest.Digest {
	return slices.Sorted(maps.Keys(set))
}

// hidden reports a dot file: what a copy to other media leaves beside the tree (.DS_Store,
// ._ files), never part of it.
func hidden(base string) bool { return strings.HasPrefix(base, ".") }

// talosBlobName is blob d's name under blob/.
func talosBlobName(d digest.Digest) string { return d.Algorithm().String() + "-" + d.Encoded() }

// talosFlat is the blob store of a --layout flat Talos image cache.
type talosFlat struct{ dir string }

func (s talosFlat) path(d digest.Digest) string { return filepath.Join(talosBlobDir, talosBlobName(d)) }

func (s talosFlat) stat(d digest.Digest) (int64, error) {
	return ociLayout(s).statAt(s.path(d))
}

func (s talosFlat) each(ctx context.Context, want map[digest.Digest]bool, f func(digest.Digest, io.Reader) error) error {
	for _, d := range sortedDigests(want) {
		if err := ctx.Err(); err != nil {
			return err
		}
		file, err := os.Open(filepath.Join(s.dir, s.path(d)))
		if errors.Is(err, fs.ErrNotExist) {
			continue // Each names it
		}
		if err != nil {
			return fmt.Errorf("read blob %s: %w", d, err)
		}
		err = f(d, file)
		file.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// openTalosFlat opens the --layout flat Talos image cache in dir.
func openTalosFlat(ctx context.Context, dir string) (*Reader, error) {
	t := newTalosTree(dir)
	root := filepath.Join(dir, talosManifestDir)
	err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case p != root && hidden(de.Name()) && de.IsDir():
			return filepath.SkipDir
		case de.IsDir() || hidden(de.Name()):
			return nil
		case !de.Type().IsRegular():
			return refusal.Errorf("bundle %s: %s is not a regular file: want a manifest's bytes", dir, p)
		}
		raw, _, err := readManifestFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return t.add(filepath.ToSlash(rel), raw)
	})
	if err != nil {
		return nil, err
	}
	images, err := t.images()
	if err != nil {
		return nil, err
	}
	r := &Reader{Dir: dir, Kind: KindTalosFlat, Images: images, src: talosFlat{dir: dir}}
	if err := r.resolve(ctx, t.lookup, nil); err != nil {
		return nil, err
	}
	return r, nil
}

// statAt is the size of the regular file rel under the layout directory.
func (l ociLayout) statAt(rel string) (int64, error) {
	fi, err := os.Lstat(filepath.Join(l.dir, rel))
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, refusal.Errorf("bundle %s: %s is not a regular file: want the blob's bytes", l.dir, rel)
	}
	return fi.Size(), nil
}

// talosOCIEntry reports whether the layout l with index idx holds a Talos image cache (Generate
// with --layout oci): one entry without a name whose image manifest has a single layer, a tar
// whose first entry is blob/ or manifests/ (the tree, sorted by path). layer is that layer.
func talosOCIEntry(l ociLayout, idx *v1.Index) (v1.Descriptor, bool) {
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations[v1.AnnotationRefName] != "" {
		return v1.Descriptor{}, false
	}
	raw, ok, err := l.manifest(idx.Manifests[0].Digest)
	if err != nil || !ok {
		return v1.Descriptor{}, false
	}
	var m v1.Manifest
	if json.Unmarshal(raw, &m) != nil || len(m.Layers) != 1 || m.Layers[0].Digest.Validate() != nil {
		return v1.Descriptor{}, false
	}
	s := &talosOCI{dir: l.dir, layer: m.Layers[0]}
	first := ""
	_ = s.walk(func(name string, _ *tar.Header, _ io.Reader) error {
		first = name
		return errStopWalk
	}, true)
	top, _, _ := strings.Cut(first, "/")
	return m.Layers[0], top == talosBlobDir || top == talosManifestDir
}

// errStopWalk ends a talosOCI walk early.
var errStopWalk = errors.New("stop")

// talosOCI is the blob store of a --layout oci Talos image cache: the tree inside the tar of
// layer, read by walking the tar (it is gzip-compressed: there is no reading one file of it
// without the ones before).
type talosOCI struct {
	dir   string
	layer v1.Descriptor
	sizes map[digest.Digest]int64 // blob/ entries, as the walk of Open found them
}

func (s *talosOCI) layerPath() string { return ociLayout{dir: s.dir}.path(s.layer.Digest) }

func (s *talosOCI) path(d digest.Digest) string {
	return s.layerPath() + ": " + path.Join(talosBlobDir, talosBlobName(d))
}

func (s *talosOCI) stat(d digest.Digest) (int64, error) {
	n, ok := s.sizes[d]
	if !ok {
		return 0, fs.ErrNotExist
	}
	return n, nil
}

func (s *talosOCI) each(ctx context.Context, want map[digest.Digest]bool, f func(digest.Digest, io.Reader) error) error {
	return s.walk(func(name string, _ *tar.Header, data io.Reader) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok := talosDigest(strings.TrimPrefix(name, talosBlobDir+"/"))
		if !ok || !strings.HasPrefix(name, talosBlobDir+"/") || !want[d] {
			return nil
		}
		return f(d, data)
	}, false)
}

// walk calls f with every regular file of the layer's tar (its name cleaned of "./"), its
// header and data; dirs are skipped. With peek the layer's own digest is not checked (the walk
// stops early); otherwise a layer that does not match it is a *DamageError, after f saw it all.
func (s *talosOCI) walk(f func(name string, hdr *tar.Header, data io.Reader) error, peek bool) error {
	file, err := os.Open(filepath.Join(s.dir, s.layerPath()))
	if err != nil {
		return fmt.Errorf("read the Talos image cache layer: %w", err)
	}
	defer file.Close()
	h := s.layer.Digest.Algorithm().Hash()
	br := bufio.NewReader(io.TeeReader(file, h))
	var tr *tar.Reader
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return s.damaged(err)
		}
		defer gz.Close()
		tr = tar.NewReader(gz)
	} else {
		tr = tar.NewReader(br)
	}
	if err := s.entries(tr, f); err != nil {
		return err
	}
	if peek {
		return nil
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return fmt.Errorf("read the Talos image cache layer: %w", err)
	}
	if got := digest.NewDigest(s.layer.Digest.Algorithm(), h); got != s.layer.Digest {
		return s.damaged(fmt.Errorf("it hashes to %s", got))
	}
	return nil
}

// entries calls f for each regular file of tr.
func (s *talosOCI) entries(tr *tar.Reader, f func(string, *tar.Header, io.Reader) error) error {
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return s.damaged(err)
		}
		name := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		switch {
		case hdr.Typeflag == tar.TypeDir || hidden(path.Base(name)):
			continue
		case hdr.Typeflag != tar.TypeReg:
			return refusal.Errorf("bundle %s: %s: %s is not a regular file: want the Talos image cache tree (blob/, manifests/)", s.dir, s.layerPath(), name)
		}
		if err := f(name, hdr, tr); errors.Is(err, errStopWalk) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// damaged is the *DamageError of a layer whose tar or gzip stream is broken (err).
func (s *talosOCI) damaged(err error) error {
	var de *DamageError
	if errors.As(err, &de) {
		return err
	}
	return &DamageError{Dir: s.dir, What: "blob", Digest: s.layer.Digest, Of: "the layer of the Talos image cache",
		Reason: fmt.Sprintf("is damaged (%s): %v", s.layerPath(), err)}
}

// openTalosOCI opens the --layout oci Talos image cache in dir, whose tree is the tar of layer:
// one walk reads every manifest and hashes every blob (the tar cannot be read in pieces).
func openTalosOCI(ctx context.Context, dir string, layer v1.Descriptor) (*Reader, error) {
	t := newTalosTree(dir)
	s := &talosOCI{dir: dir, layer: layer, sizes: map[digest.Digest]int64{}}
	var damaged []error
	err := s.walk(func(name string, _ *tar.Header, data io.Reader) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		top, rest, _ := strings.Cut(name, "/")
		switch top {
		case talosManifestDir:
			raw, err := io.ReadAll(io.LimitReader(data, MaxManifestBytes+1))
			if err != nil {
				return s.damaged(err)
			}
			if len(raw) > MaxManifestBytes {
				return refusal.Errorf("bundle %s: %s: %s is larger than %d bytes: not a manifest", dir, s.layerPath(), name, MaxManifestBytes)
			}
			return t.add(rest, raw)
		case talosBlobDir:
			return s.hashBlob(name, rest, data, &damaged)
		}
		return refusal.Errorf("bundle %s: %s: %s is neither under blob/ nor under manifests/: want the Talos image cache tree", dir, s.layerPath(), name)
	}, false)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(damaged...); err != nil {
		return nil, err
	}
	images, err := t.images()
	if err != nil {
		return nil, err
	}
	r := &Reader{Dir: dir, Kind: KindTalosOCI, Images: images, src: s}
	if err := r.resolve(ctx, t.lookup, nil); err != nil {
		return nil, err
	}
	return r, nil
}

// hashBlob records the size of blob entry name (file under blob/) and checks it against its
// digest; a mismatch is added to damaged.
func (s *talosOCI) hashBlob(name, file string, data io.Reader, damaged *[]error) error {
	d, ok := talosDigest(file)
	if !ok {
		return refusal.Errorf("bundle %s: %s: %s is not blob/sha256-<64 hex digits>: want the Talos image cache tree", s.dir, s.layerPath(), name)
	}
	h := d.Algorithm().Hash()
	n, err := io.Copy(h, data)
	if err != nil {
		return s.damaged(err)
	}
	s.sizes[d] = n
	if got := digest.NewDigest(d.Algorithm(), h); got != d {
		*damaged = append(*damaged, &DamageError{Dir: s.dir, What: "blob", Digest: d,
			Reason: fmt.Sprintf("does not match its digest: its %d bytes hash to %s (%s)", n, got, s.path(d))})
	}
	return nil
}
