package mirror

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// maxImportPlan bounds an import's plan (JSON): its manifests' bytes and the lists of images and
// blobs of a bundle of hundreds of images fit many times.
const maxImportPlan = 64 << 20

// serveImport answers mirrorapi.CacheImportCheckPath and mirrorapi.CacheImportPath: POST from
// loopback and the --allow networks, once the cache index is loaded.
func (m *Mirror) serveImport(w http.ResponseWriter, r *http.Request) {
	switch {
	case !m.clients.allowed(r.RemoteAddr):
		m.metrics.refused.WithLabelValues(RefusedAllow).Inc()
		writeJSONError(w, http.StatusForbidden, "cache imports are accepted from loopback and --allow networks only")
		return
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		writeJSONError(w, http.StatusMethodNotAllowed, "want POST "+mirrorapi.CacheImportCheckPath+" (a plan, JSON) or POST "+mirrorapi.CacheImportPath+" (the plan and blobs, a tar stream)")
		return
	case !m.cache.Ready():
		writeJSONError(w, http.StatusServiceUnavailable, "the cache index is being loaded; try again shortly")
		return
	}
	var (
		out any
		err error
	)
	if r.URL.Path == mirrorapi.CacheImportCheckPath {
		out, err = m.importCheck(r)
	} else {
		out, err = m.importStream(r)
	}
	if err != nil {
		status := http.StatusInternalServerError
		var ie *importError
		if errors.As(err, &ie) {
			status = ie.status
		}
		m.log.Warn().Err(err).Str("client", r.RemoteAddr).Int("status", status).Msg("cache import refused")
		writeJSONError(w, status, err.Error())
		return
	}
	_ = json.NewEncoder(w).Encode(out)
}

// importCheck answers which blobs of the plan in r's body the cache does not store.
func (m *Mirror) importCheck(r *http.Request) (*mirrorapi.ImportCheck, error) {
	plan, err := decodePlan(r.Body)
	if err != nil {
		return nil, err
	}
	job, err := m.planImport(plan)
	if err != nil {
		return nil, err
	}
	return &mirrorapi.ImportCheck{Missing: m.missingBlobs(job)}, nil
}

// decodePlan reads a plan, at most maxImportPlan bytes of JSON.
func decodePlan(body io.Reader) (mirrorapi.ImportPlan, error) {
	var plan mirrorapi.ImportPlan
	raw, err := io.ReadAll(io.LimitReader(body, maxImportPlan+1))
	switch {
	case err != nil:
		return plan, fmt.Errorf("read the import plan: %w", err)
	case len(raw) > maxImportPlan:
		return plan, importRefused("the import plan is larger than %d bytes: import the bundle in parts", maxImportPlan)
	}
	if err := json.Unmarshal(raw, &plan); err != nil {
		return plan, importRefused("the import plan is not JSON of mirrorapi.ImportPlan: %v", err)
	}
	return plan, nil
}

// importStream reads r's tar stream (the plan, then blobs), stages every blob and stores the
// plan's images once all of them are staged or stored.
func (m *Mirror) importStream(r *http.Request) (*mirrorapi.ImportResult, error) {
	ctx := r.Context()
	tr := tar.NewReader(r.Body)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != mirrorapi.ImportPlanEntry {
		return nil, importRefused("the import stream is not a tar whose first entry is %s (as nodecache cache import sends it)", mirrorapi.ImportPlanEntry)
	}
	plan, err := decodePlan(tr)
	if err != nil {
		return nil, err
	}
	job, err := m.planImport(plan)
	if err != nil {
		return nil, err
	}
	st := m.newStaging()
	defer st.remove()
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read the import stream: %w", err)
		}
		d, ok := blobEntry(hdr.Name)
		size, inPlan := job.blobs[d]
		switch {
		case !ok:
			return nil, importRefused("import stream entry %q: want %s", hdr.Name, mirrorapi.ImportBlobEntry("<algorithm>:<encoded>"))
		case !inPlan:
			return nil, importRefused("blob %s is not a blob of the plan", d)
		case hdr.Size != size:
			return nil, importDamaged("blob %s: its entry is %d bytes, its manifests say %d", d, hdr.Size, size)
		}
		if err := m.stageBlob(st, job, d, tr); err != nil {
			return nil, err
		}
	}
	res, err := m.commitImport(ctx, job, st)
	if err != nil {
		return nil, err
	}
	m.log.Info().Str("client", r.RemoteAddr).Int("images", len(res.Images)).Int("manifests", res.Manifests).Int("blobs_stored", res.BlobsStored).
		Int64("bytes_stored", res.BytesStored).Int("blobs_present", res.BlobsPresent).Msg("images imported")
	return &res, nil
}

// blobEntry parses an import stream entry name "blobs/<algorithm>/<encoded>".
func blobEntry(n string) (digest.Digest, bool) {
	rest, ok := strings.CutPrefix(n, "blobs/")
	alg, enc, ok2 := strings.Cut(rest, "/")
	d := digest.NewDigestFromEncoded(digest.Algorithm(alg), enc)
	return d, ok && ok2 && d.Validate() == nil
}
