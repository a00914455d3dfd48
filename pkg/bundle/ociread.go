package bundle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// maxIndexJSON bounds index.json: a layout of thousands of images is well under it.
const maxIndexJSON = 16 << 20

// ociLayout is an OCI image layout's files (OCI image spec, image-layout.md): blobs under
// blobs/<algorithm>/<encoded>.
type ociLayout struct{ dir string }

func (l ociLayout) path(d digest.Digest) string {
	return filepath.Join("blobs", d.Algorithm().String(), d.Encoded())
}

func (l ociLayout) stat(d digest.Digest) (int64, error) { return l.statAt(l.path(d)) }

func (l ociLayout) each(ctx context.Context, want map[digest.Digest]bool, f func(digest.Digest, io.Reader) error) error {
	// The files are read in digest order: any order is the layout's own.
	for _, d := range sortedDigests(want) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.open(d, f); err != nil {
			return err
		}
	}
	return nil
}

// open calls f with blob d's file; a blob that is gone is skipped (Each names it).
func (l ociLayout) open(d digest.Digest, f func(digest.Digest, io.Reader) error) error {
	file, err := os.Open(filepath.Join(l.dir, l.path(d)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read blob %s: %w", d, err)
	}
	defer file.Close()
	return f(d, file)
}

// manifest is the layout's manifestLookup: manifests are blobs of the layout.
func (l ociLayout) manifest(d digest.Digest) ([]byte, bool, error) {
	if d.Validate() != nil {
		return nil, false, nil
	}
	return readManifestFile(filepath.Join(l.dir, l.path(d)))
}

// readIndex reads dir's oci-layout (when present: its version must be 1.x) and index.json.
func readIndex(dir string) (*v1.Index, error) {
	// Read through inputfile: a named pipe (or device) in place of a file is refused after a
	// stat, never opened, so a bundle cannot block the import or serve --seed.
	if raw, err := inputfile.Read(filepath.Join(dir, v1.ImageLayoutFile), ociLayoutKind); err == nil {
		var l v1.ImageLayout
		if json.Unmarshal(raw, &l) != nil || !strings.HasPrefix(l.Version, "1.") {
			return nil, refusal.Errorf("bundle %s: oci-layout %q: want {\"imageLayoutVersion\": \"1.0.0\"} (OCI image layout 1.x)", dir, strings.TrimSpace(string(raw)))
		}
	} else if inputfile.Refused(err) {
		return nil, err
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, v1.ImageLayoutFile), err)
	}
	p := filepath.Join(dir, v1.ImageIndexFile)
	raw, err := inputfile.Read(p, inputfile.Kind{Name: "an OCI image index (index.json)", Limit: maxIndexJSON})
	if inputfile.Refused(err) {
		return nil, err
	}
	if err != nil {
		return nil, &refusal.Error{Source: "bundle " + dir, Reason: "has no readable index.json: " + err.Error() + "; " + acceptedLayouts, Err: err}
	}
	var idx v1.Index
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, refusal.Errorf("%s is not an OCI image index: %v", p, err)
	}
	if len(idx.Manifests) == 0 {
		return nil, refusal.Errorf("%s lists no image", p)
	}
	return &idx, nil
}

// openOCI opens the OCI image layout in dir: a Talos image cache in it (talosOCIEntry) is read
// as one; otherwise each entry of index.json is an image, named by its
// org.opencontainers.image.ref.name or opts.Ref (names).
func openOCI(ctx context.Context, dir string, opts ReadOptions) (*Reader, error) {
	idx, err := readIndex(dir)
	if err != nil {
		return nil, err
	}
	l := ociLayout{dir: dir}
	if layer, ok := talosOCIEntry(l, idx); ok {
		if opts.Ref != "" {
			return nil, refusal.Errorf("--ref %q: the Talos image cache in %s names its images itself; drop --ref", opts.Ref, dir)
		}
		return openTalosOCI(ctx, dir, layer)
	}
	images, err := names(dir, idx.Manifests, opts.Ref)
	if err != nil {
		return nil, err
	}
	hints := map[digest.Digest]string{}
	for _, m := range idx.Manifests {
		hints[m.Digest] = m.MediaType
	}
	r := &Reader{Dir: dir, Kind: KindOCILayout, Images: images, src: l}
	if err := r.resolve(ctx, l.manifest, hints); err != nil {
		return nil, err
	}
	return r, nil
}

// refSpec is a reference without its digest: registry (name.Canonical), repository, tag.
type refSpec struct{ registry, repository, tag string }

// tagOnly is a tag alone, as skopeo's oci: transport records it (reference.TagRegexp).
var tagOnly = regexp.MustCompile(`^` + reference.TagRegexp.String() + `$`)

// fullRef parses s as REGISTRY/REPOSITORY[:TAG][@DIGEST] with a registry that is one (a first
// component with a "." or ":", or localhost: distribution's rule for telling a registry from a
// Docker Hub namespace). ok is false for anything else; err for a reference that has a registry
// but does not parse.
func fullRef(s string) (spec refSpec, d digest.Digest, ok bool, err error) {
	first, _, slash := strings.Cut(s, "/")
	if !slash || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		return refSpec{}, "", false, nil
	}
	ref, err := reference.Parse(s)
	if err != nil {
		return refSpec{}, "", true, err
	}
	named, isNamed := ref.(reference.Named)
	if !isNamed {
		return refSpec{}, "", true, errors.New("no repository")
	}
	reg, err := name.ParseRegistry(first)
	if err != nil {
		return refSpec{}, "", true, err
	}
	spec = refSpec{registry: name.Canonical(reg), repository: strings.TrimPrefix(named.Name(), first+"/")}
	if spec.registry == name.DockerHub && !strings.Contains(spec.repository, "/") {
		spec.repository = "library/" + spec.repository
	}
	if t, isTagged := ref.(reference.Tagged); isTagged {
		spec.tag = t.Tag()
	}
	if dg, isDigested := ref.(reference.Digested); isDigested {
		d = dg.Digest()
	}
	return spec, d, true, nil
}

// parseRefFlag parses --ref: REGISTRY/REPOSITORY[:TAG], no digest (the layout gives it).
func parseRefFlag(s string) (refSpec, error) {
	spec, d, ok, err := fullRef(s)
	switch {
	case !ok:
		return refSpec{}, refusal.Value("--ref", s, "want REGISTRY/REPOSITORY[:TAG] with the registry the images come from, e.g. docker.io/library/alpine or ghcr.io/siderolabs/kubelet:v1.33.0")
	case err != nil:
		return refSpec{}, refusal.Value("--ref", s, err.Error()+"; want REGISTRY/REPOSITORY[:TAG]")
	case d != "":
		return refSpec{}, refusal.Value("--ref", s, "a digest: the layout's index.json gives each image's digest; want REGISTRY/REPOSITORY[:TAG]")
	}
	return spec, nil
}

// names names the images of the entries of index.json: an entry whose
// org.opencontainers.image.ref.name is a full reference by it; one named by a tag alone
// (skopeo copy … oci:DIR:TAG) as ref's registry and repository with that tag; one with no name
// (crane pull --format oci) as ref, by ref's tag or by digest alone. ref is refused when no entry
// needs it, and an entry that needs it is refused without it.
func names(dir string, entries []v1.Descriptor, ref string) ([]Named, error) {
	var spec refSpec
	if ref != "" {
		var err error
		if spec, err = parseRefFlag(ref); err != nil {
			return nil, err
		}
	}
	out := make([]Named, 0, len(entries))
	needed, unnamed := false, 0
	for i, e := range entries {
		n, needs, err := entryName(dir, i, e, ref, spec)
		if err != nil {
			return nil, err
		}
		needed = needed || needs
		if e.Annotations[v1.AnnotationRefName] == "" {
			unnamed++
		}
		out = append(out, n)
	}
	switch {
	case ref != "" && !needed:
		return nil, refusal.Errorf("--ref %q: every image in %s is named by a full reference in index.json (%s); drop --ref", ref, dir, out[0].String())
	case spec.tag != "" && unnamed > 1:
		return nil, refusal.Errorf("--ref %q: %d images in %s have no name, and one tag cannot name them all; give --ref without a tag (they are imported by digest)", ref, unnamed, dir)
	}
	return out, checkDuplicates(dir, out)
}

// entryName names entry i of index.json (see names); needs reports that it took ref.
func entryName(dir string, i int, e v1.Descriptor, ref string, spec refSpec) (n Named, needs bool, err error) {
	refName := e.Annotations[v1.AnnotationRefName]
	where := fmt.Sprintf("%s: index.json entry %d (%s)", dir, i+1, e.Digest)
	full, d, isFull, perr := fullRef(refName)
	switch {
	case isFull && perr != nil:
		return n, false, refusal.Errorf("%s: %s %q: %v", where, v1.AnnotationRefName, refName, perr)
	case isFull && d != "" && d != e.Digest:
		return n, false, refusal.Errorf("%s is named %q, with another digest", where, refName)
	case isFull:
		return Named{Registry: full.registry, Repository: full.repository, Tag: full.tag, Digest: e.Digest}, false, nil
	case refName != "" && !tagOnly.MatchString(refName):
		return n, false, refusal.Errorf("%s is named %q: want a full reference REGISTRY/REPOSITORY:TAG in %s (as nodecache warm --to and crane pull --annotate-ref write it) or a tag alone (as skopeo copy … oci:DIR:TAG writes it, with --ref REGISTRY/REPOSITORY)",
			where, refName, v1.AnnotationRefName)
	case ref == "" && refName != "":
		return n, true, &refusal.Error{Err: ErrNeedsRef, Reason: fmt.Sprintf("%s is named by the tag %q alone (as skopeo copy … oci:DIR:TAG writes it): give its registry and repository with --ref REGISTRY/REPOSITORY, e.g. --ref docker.io/library/alpine", where, refName)}
	case ref == "":
		return n, true, &refusal.Error{Err: ErrNeedsRef, Reason: fmt.Sprintf("%s has no %s (as crane pull --format oci writes it without --annotate-ref): name it with --ref REGISTRY/REPOSITORY[:TAG], e.g. --ref docker.io/library/alpine:3.20", where, v1.AnnotationRefName)}
	case refName != "" && spec.tag != "" && spec.tag != refName:
		return n, true, refusal.Errorf("--ref %q: %s is named by the tag %q; give --ref without a tag or with that one", ref, where, refName)
	}
	tag := refName
	if tag == "" {
		tag = spec.tag
	}
	return Named{Registry: spec.registry, Repository: spec.repository, Tag: tag, Digest: e.Digest}, true, nil
}

// checkDuplicates refuses two images under one tag with different digests.
func checkDuplicates(dir string, images []Named) error {
	seen := map[string]digest.Digest{}
	for _, n := range images {
		if n.Tag == "" {
			continue
		}
		k := n.Registry + "/" + n.Repository + ":" + n.Tag
		if d, dup := seen[k]; dup && d != n.Digest {
			return refusal.Errorf("bundle %s names two images %s: %s and %s", dir, k, d, n.Digest)
		}
		seen[k] = n.Digest
	}
	return nil
}
