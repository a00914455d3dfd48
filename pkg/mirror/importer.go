package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// An import stores the images of a bundle (nodecache cache import over HTTP, importapi.go;
// serve --seed from serve's own filesystem, seed.go) in three steps, so that nothing of a
// bundle is half stored: planImport checks the plan (every image's upstream, repository and
// tag, every manifest against its digest) before anything is read; stageBlob writes every blob
// the cache does not hold yet to a staging file, checking its size and digest; commitImport,
// once every blob is staged or stored, stores each image through the commit path of a fill:
// blobs, then manifests (every child before its index), then tags, then pins.

// importError is an import refused or failed, with the status its HTTP answer carries.
type importError struct {
	status int
	err    error
}

func (e *importError) Error() string { return e.err.Error() }
func (e *importError) Unwrap() error { return e.err }

// Is makes a refused plan (400) refused input: serve --seed exits 2 for it, as for a bundle the
// reader refuses.
func (e *importError) Is(target error) bool {
	return e.status == http.StatusBadRequest && target == refusal.ErrRefused
}

// importRefused is a plan serve refuses (400).
func importRefused(format string, args ...any) error {
	return &importError{status: http.StatusBadRequest, err: fmt.Errorf(format, args...)}
}

// importDamaged is a blob that does not match, or is missing (422): nothing was stored.
func importDamaged(format string, args ...any) error {
	return &importError{status: http.StatusUnprocessableEntity, err: fmt.Errorf(format, args...)}
}

// importJob is a plan as planImport checked it.
type importJob struct {
	images    []importImage
	manifests map[digest.Digest]upstream.Manifest
	blobs     map[digest.Digest]int64 // config and layer blobs: size in bytes
	repos     []*importRepo           // in the order of the images
}

// importImage is one image of a job.
type importImage struct {
	up     *configured
	repo   string
	tag    string
	digest digest.Digest
}

// reference is what the image is pinned by: its tag, else its digest.
func (i importImage) reference() string {
	if i.tag != "" {
		return i.tag
	}
	return i.digest.String()
}

// importRepo is what a job stores in one repository of one upstream.
type importRepo struct {
	up        *configured
	repo      string
	blobs     []digest.Digest
	manifests []digest.Digest // every child before the index that lists it
	seen      map[digest.Digest]bool
}

// tagPattern is a tag (distribution/reference's grammar).
var tagPattern = regexp.MustCompile(`^` + reference.TagRegexp.String() + `$`)

// planImport checks plan p: every manifest parses as what its media type says and matches its
// digest (at most upstream.MaxManifestBytes, cache.MaxManifestRefs descriptors), every blob
// digest is valid, every image names a configured upstream (by name or alias), a valid
// repository and tag and a manifest of the plan, and every config and layer those manifests
// reference is a blob of the plan at the size they state.
//
// Errors: an *importError of status 400 naming what is refused.
func (m *Mirror) planImport(p mirrorapi.ImportPlan) (*importJob, error) {
	job := &importJob{manifests: map[digest.Digest]upstream.Manifest{}, blobs: map[digest.Digest]int64{}}
	parsed := map[digest.Digest]distribution.Manifest{}
	for _, pm := range p.Manifests {
		fm, man, err := checkManifest(pm)
		if err != nil {
			return nil, err
		}
		job.manifests[fm.Digest], parsed[fm.Digest] = fm, man
	}
	for _, b := range p.Blobs {
		d, err := digest.Parse(b.Digest)
		if err != nil || !d.Algorithm().Available() || b.Size < 0 {
			return nil, importRefused("blob %q of %d bytes: want a sha256 or sha512 digest and a size", b.Digest, b.Size)
		}
		job.blobs[d] = b.Size
	}
	repos := map[string]*importRepo{}
	for _, pi := range p.Images {
		img, err := m.checkImage(pi, job)
		if err != nil {
			return nil, err
		}
		job.images = append(job.images, img)
		k := img.up.storageKey + "/" + img.repo
		if repos[k] == nil {
			repos[k] = &importRepo{up: img.up, repo: img.repo, seen: map[digest.Digest]bool{}}
			job.repos = append(job.repos, repos[k])
		}
		if err := job.walk(repos[k], parsed, img.digest, img.String(), 0); err != nil {
			return nil, err
		}
	}
	if len(job.images) == 0 {
		return nil, importRefused("the plan holds no image")
	}
	if err := m.checkPinRoom(job); err != nil {
		return nil, err
	}
	return job, nil
}

// checkPinRoom refuses, before anything is sent or stored, an import whose blobs the cache does
// not hold yet would take the pinned bytes above cache.MaxPinnedShare of --max-size: its
// images could not all be pinned, and storing them would evict them again (or what else the
// cache holds) before their pins were taken. Blobs the cache holds already are not counted (an
// import repeated adds nothing); the pin of each image (Pin) remains the exact check.
//
// Errors: an *importError of status 409 naming the bytes and the cap.
func (m *Mirror) checkPinRoom(job *importJob) error {
	capBytes := m.cache.MaxSize()
	if capBytes <= 0 {
		return nil
	}
	var adds int64
	for d, size := range job.blobs {
		if !m.cache.HasBlob(d, size) {
			adds += size
		}
	}
	pinned := m.cache.PinnedBytes()
	if limit := int64(cache.MaxPinnedShare * float64(capBytes)); pinned+adds > limit {
		return &importError{status: http.StatusConflict, err: fmt.Errorf("%w: the bundle adds %s (%d bytes) the cache does not hold, and pins hold %s already: imported images are pinned, and pins may hold at most %.0f%% of --max-size %s (%d bytes); nothing was imported: raise --max-size, or import fewer images",
			ErrPinLimit, clitext.Bytes(adds), adds, clitext.Bytes(pinned), cache.MaxPinnedShare*100, clitext.Bytes(capBytes), capBytes)}
	}
	return nil
}

// String names the image as the bundle does: UPSTREAM/REPOSITORY[:TAG]@DIGEST.
func (i importImage) String() string {
	s := i.up.Name + "/" + i.repo
	if i.tag != "" {
		s += ":" + i.tag
	}
	return s + "@" + i.digest.String()
}

// checkManifest checks one manifest of a plan and returns it as a fill would have it, parsed.
func checkManifest(pm mirrorapi.ImportManifest) (upstream.Manifest, distribution.Manifest, error) {
	d, err := digest.Parse(pm.Digest)
	switch {
	case err != nil || !d.Algorithm().Available():
		return upstream.Manifest{}, nil, importRefused("manifest digest %q: want a sha256 or sha512 digest", pm.Digest)
	case len(pm.Raw) > upstream.MaxManifestBytes:
		return upstream.Manifest{}, nil, importRefused("manifest %s is %d bytes: at most %d are accepted", d, len(pm.Raw), upstream.MaxManifestBytes)
	case d.Algorithm().FromBytes(pm.Raw) != d:
		return upstream.Manifest{}, nil, importDamaged("manifest %s does not match its digest: its %d bytes hash to %s", d, len(pm.Raw), d.Algorithm().FromBytes(pm.Raw))
	}
	mt, err := upstream.ManifestType(pm.MediaType, pm.Raw)
	if err != nil {
		return upstream.Manifest{}, nil, importRefused("manifest %s: %v", d, err)
	}
	if _, listed := cache.ManifestRefs(pm.Raw, cache.MaxManifestRefs); listed > cache.MaxManifestRefs {
		return upstream.Manifest{}, nil, importRefused("manifest %s lists %d descriptors; nodecache refuses more than %d per manifest", d, listed, cache.MaxManifestRefs)
	}
	man, _, err := distribution.UnmarshalManifest(mt, pm.Raw)
	if err != nil {
		return upstream.Manifest{}, nil, importRefused("manifest %s of media type %s: %v", d, mt, err)
	}
	return upstream.Manifest{Raw: pm.Raw, Digest: d, MediaType: mt}, man, nil
}

// checkImage checks one image of a plan: its upstream, repository, tag and manifest.
func (m *Mirror) checkImage(pi mirrorapi.ImportImage, job *importJob) (importImage, error) {
	up := m.upstreamNamed(pi.Upstream)
	if up == nil {
		return importImage{}, importRefused("image %s/%s: %s is not an upstream of this serve (configured: %s): add it with serve --upstream %s[=URL] to import its images",
			pi.Upstream, pi.Repository, pi.Upstream, m.upstreamList(), pi.Upstream)
	}
	repo := pi.Repository
	if name.Canonical(up.Name) == name.DockerHub && !strings.Contains(repo, "/") {
		repo = "library/" + repo
	}
	if _, err := reference.WithName(up.storageKey + "/" + repo); err != nil || repo == "" {
		return importImage{}, importRefused("image %s/%s: %q is not a repository name", pi.Upstream, pi.Repository, pi.Repository)
	}
	if pi.Tag != "" && !tagPattern.MatchString(pi.Tag) {
		return importImage{}, importRefused("image %s/%s: %q is not a tag", pi.Upstream, repo, pi.Tag)
	}
	d, err := digest.Parse(pi.Digest)
	if err != nil {
		return importImage{}, importRefused("image %s/%s: digest %q: %v", pi.Upstream, repo, pi.Digest, err)
	}
	if _, ok := job.manifests[d]; !ok {
		return importImage{}, importRefused("image %s/%s@%s: its manifest is not in the plan", pi.Upstream, repo, d)
	}
	return importImage{up: up, repo: repo, tag: pi.Tag, digest: d}, nil
}

// upstreamNamed is the configured upstream called n or one of its aliases; nil when none is.
func (m *Mirror) upstreamNamed(n string) *configured {
	for _, u := range m.upstreams {
		if name.Canonical(u.Name) == name.Canonical(n) {
			return u
		}
	}
	return nil
}

// walk adds manifest d (of image of) and what it references to r: an index's children that the
// plan holds (the others are platforms the bundle left out), an image manifest's config and
// layers, which must be blobs of the plan at the size the manifest states.
func (job *importJob) walk(r *importRepo, parsed map[digest.Digest]distribution.Manifest, d digest.Digest, of string, depth int) error {
	if r.seen[d] {
		return nil
	}
	r.seen[d] = true
	man := parsed[d]
	if mt := job.manifests[d].MediaType; mt == mirrorapi.MediaTypeOCIIndex || mt == mirrorapi.MediaTypeDockerList {
		if depth >= 4 {
			return importRefused("index %s of %s nests indexes deeper than 4 levels", d, of)
		}
		for _, c := range man.References() {
			if parsed[c.Digest] != nil {
				if err := job.walk(r, parsed, c.Digest, of, depth+1); err != nil {
					return err
				}
			}
		}
	} else {
		for _, b := range man.References() {
			size, ok := job.blobs[b.Digest]
			if !ok || size != b.Size {
				return importRefused("manifest %s of %s references blob %s of %d bytes, which the plan does not list at that size", d, of, b.Digest, b.Size)
			}
			if !r.seen[b.Digest] {
				r.seen[b.Digest] = true
				r.blobs = append(r.blobs, b.Digest)
			}
		}
	}
	r.manifests = append(r.manifests, d)
	return nil
}

// missingBlobs are the blobs of job the cache does not store (cache.Store.HasBlob), in digest
// order: what an import must carry.
func (m *Mirror) missingBlobs(job *importJob) []mirrorapi.ImportBlob {
	out := []mirrorapi.ImportBlob{}
	for _, d := range slices.Sorted(maps.Keys(job.blobs)) {
		if !m.cache.HasBlob(d, job.blobs[d]) {
			out = append(out, mirrorapi.ImportBlob{Digest: d.String(), Size: job.blobs[d]})
		}
	}
	return out
}

// importStaging holds the staged blobs of one import: files in the fills' staging directory
// (on the file system of the root: a commit hard-links them), removed by remove whatever
// happened.
type importStaging struct {
	dir   string
	files map[digest.Digest]string
}

func (m *Mirror) newStaging() *importStaging {
	return &importStaging{dir: m.fetch.StagingDir(), files: map[digest.Digest]string{}}
}

func (st *importStaging) remove() {
	for _, p := range st.files {
		_ = os.Remove(p)
	}
}

// stageBlob writes blob d of job, read from data, to a staging file, fsynced, once it has
// checked the data is the plan's size for d and hashes to d.
//
// Errors: 400 for a blob the plan does not list or sent twice; 422 naming the blob for data of
// another size or digest; 507 when the disk is full; data's own error (a bundle's
// *bundle.DamageError) wrapped.
func (m *Mirror) stageBlob(st *importStaging, job *importJob, d digest.Digest, data io.Reader) error {
	size, ok := job.blobs[d]
	switch {
	case !ok:
		return importRefused("blob %s is not a blob of the plan", d)
	case st.files[d] != "":
		return importRefused("blob %s is sent twice", d)
	}
	f, err := os.CreateTemp(st.dir, "import-*")
	if err != nil {
		return fmt.Errorf("stage blob %s: %w", d, err)
	}
	st.files[d] = f.Name()
	h := d.Algorithm().Hash()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(data, size+1))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return &importError{status: http.StatusInsufficientStorage, err: fmt.Errorf("stage blob %s (%d bytes): the disk of --root is full: free room, or evict images (cache rm), and import again", d, size)}
	case err != nil:
		return fmt.Errorf("stage blob %s: %w", d, err)
	case n != size:
		return importDamaged("blob %s: %d bytes sent, its manifests say %d", d, n, size)
	}
	if got := digest.NewDigest(d.Algorithm(), h); got != d {
		return importDamaged("blob %s does not match its digest: its %d bytes hash to %s", d, n, got)
	}
	return nil
}

// commitImport stores job's images once every blob of it is staged (st) or stored: blobs into
// each repository that uses them (a staged one committed as a fill's, a stored one linked),
// then every manifest (children first), then the tags, then the pins. Eviction leaves the
// blobs alone meanwhile. When storing fails, the images it had stored are evicted again.
//
// Errors: 422 naming a blob that is neither staged nor stored (nothing stored); the failure
// to store, wrapped; every pin refused, joined (the images stay stored, the others pinned).
func (m *Mirror) commitImport(ctx context.Context, job *importJob, st *importStaging) (mirrorapi.ImportResult, error) {
	res := mirrorapi.ImportResult{Images: []mirrorapi.ImportImage{}}
	for d := range job.blobs {
		defer m.cache.Acquire(d)() // released when the import is done
	}
	for _, d := range slices.Sorted(maps.Keys(job.blobs)) {
		if st.files[d] == "" && !m.cache.HasBlob(d, job.blobs[d]) {
			return res, importDamaged("blob %s is neither in the import nor stored in the cache (evicted since the check?): import again", d)
		}
	}
	existed := map[int]bool{}
	for i, img := range job.images {
		existed[i] = m.cache.HasManifest(img.up.storageKey+"/"+img.repo, img.digest)
	}
	err := m.storeImport(ctx, job, st, &res)
	if err != nil {
		for i, img := range job.images {
			if !existed[i] {
				m.cache.EvictImage(context.WithoutCancel(ctx), img.up.storageKey+"/"+img.repo, img.digest, cache.EvictAPI)
			}
		}
		return mirrorapi.ImportResult{}, fmt.Errorf("%w (what the import had stored was removed again)", err)
	}
	// Every image is pinned by the reference it was imported under: its tag, or its digest for
	// an image imported by digest alone (Pin, pins.go). One refused pin does not stop the others:
	// an image over the pinned share of --max-size stays stored, unpinned, the images the cap
	// leaves room for are pinned all the same, and the answer names each refused one (409 when
	// every refusal is the cap's).
	var refused []error
	limitOnly := true
	for _, img := range job.images {
		if _, err := m.Pin(ctx, img.up.Name, img.repo, img.reference()); err != nil {
			refused = append(refused, fmt.Errorf("%s is stored, but pinning it failed: %w", img, err))
			limitOnly = limitOnly && errors.Is(err, ErrPinLimit)
			continue
		}
		res.Images = append(res.Images, mirrorapi.ImportImage{Upstream: img.up.Name, Repository: img.repo, Tag: img.tag, Digest: img.digest.String()})
	}
	if err := errors.Join(refused...); err != nil {
		if limitOnly {
			err = &importError{status: http.StatusConflict, err: err}
		}
		return res, err
	}
	return res, nil
}

// storeImport is commitImport's storing: blobs, manifests, tags.
func (m *Mirror) storeImport(ctx context.Context, job *importJob, st *importStaging, res *mirrorapi.ImportResult) error {
	repos := make([]*repository, len(job.repos))
	done := map[digest.Digest]bool{}
	for i, ir := range job.repos {
		r, err := m.repository(ctx, route{up: ir.up, repo: ir.repo}, ir.repo)
		if err != nil {
			return fmt.Errorf("open repository %s/%s: %w", ir.up.Name, ir.repo, err)
		}
		repos[i] = r
		if err := m.storeBlobs(ctx, r, ir, job, st, done, res); err != nil {
			return err
		}
	}
	for i, ir := range job.repos {
		for _, d := range ir.manifests {
			if _, err := repos[i].keepManifest(ctx, job.manifests[d]); err != nil {
				return err
			}
			res.Manifests++
		}
	}
	for _, img := range job.images {
		if img.tag == "" {
			continue
		}
		r := repos[slices.IndexFunc(job.repos, func(ir *importRepo) bool { return ir.up == img.up && ir.repo == img.repo })]
		if err := r.local.Tags(ctx).Tag(ctx, img.tag, v1.Descriptor{Digest: img.digest}); err != nil {
			return fmt.Errorf("store tag %s: %w", img, err)
		}
		r.cache.Tagged(r.storageName(), img.tag, img.digest)
		r.fetch.MarkTagFresh(img.up.Name, img.repo, img.tag)
	}
	return nil
}

// storeBlobs stores the blobs of ir in repository r: the first repository of a staged blob
// commits it as a fill's (done records that), every other links the stored data.
func (m *Mirror) storeBlobs(ctx context.Context, r *repository, ir *importRepo, job *importJob, st *importStaging, done map[digest.Digest]bool, res *mirrorapi.ImportResult) error {
	for _, d := range ir.blobs {
		size := job.blobs[d]
		p := st.files[d]
		switch {
		case p != "" && !done[d]:
			if err := r.commitBlob(ctx, p, v1.Descriptor{Digest: d, Size: size}); err != nil {
				return fmt.Errorf("store blob %s: %w", d, err)
			}
			res.BlobsStored++
			res.BytesStored += size
		default:
			if err := m.cache.LinkStored(ctx, r.storageName(), d); err != nil {
				return err
			}
			if p == "" && !done[d] {
				res.BlobsPresent++
			}
		}
		done[d] = true
	}
	return nil
}
