package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/opencontainers/go-digest"
)

// ReferrersFile is the name of a stored referrers list in its subject's revision directory.
const ReferrersFile = "nodecache-referrers.json"

// ReferrersPath is where the referrers list of manifest subject of storage repository repo is
// stored (OCI distribution spec, "Listing Referrers"): a file of nodecache's in the subject's
// revision directory (RevisionPath), beside distribution's link. Evicting the subject deletes
// that directory, so the list lives exactly as long as the manifest it lists the referrers of:
// kept while a pin holds the subject's image, gone with it under the cap, on a full disk and by
// cache rm. Distribution reads only the link there, and an index rebuild only links.
func ReferrersPath(repo string, subject digest.Digest) string {
	return path.Join(RevisionPath(repo, subject), ReferrersFile)
}

// ErrNoSubject is PutReferrers' error when the index holds no manifest subject in the
// repository: a list is stored only with the manifest whose lifetime it shares.
var ErrNoSubject = errors.New("the subject manifest is not cached")

// PutReferrers stores b, the referrers list of manifest subject of storage repository repo, at
// ReferrersPath, replacing the one stored: on filesystem storage through a temporary file in the
// same directory, fsynced and renamed over it (a reader sees the old list or the new one, never
// part of one), elsewhere by the driver's PutContent (one object in a bucket). The subject must
// be in the index; when an eviction removes it meanwhile the list just written is deleted again,
// so no list outlives its subject's revision directory.
//
// Errors: ErrNoSubject (nothing written), a failed write.
func (s *Store) PutReferrers(ctx context.Context, repo string, subject digest.Digest, b []byte) error {
	if !s.idx.HasManifest(repo, subject) {
		return ErrNoSubject
	}
	p := ReferrersPath(repo, subject)
	var err error
	if s.fsRoot != "" {
		file := filepath.Join(s.fsRoot, filepath.FromSlash(p))
		if err = writeFileAtomic(file, b); err == nil {
			err = os.Chmod(file, 0o644) // as the driver writes files (0666 less the umask)
		}
	} else {
		err = s.driver.PutContent(ctx, p, b)
	}
	if err != nil {
		s.fullOn(err)
		return fmt.Errorf("store referrers of %s@%s: %w", repo, subject, err)
	}
	// Eviction drops the manifest from the index before it deletes the revision directory: a
	// list written after that delete is caught here.
	if !s.idx.HasManifest(repo, subject) {
		_ = s.driver.Delete(ctx, p)
		return ErrNoSubject
	}
	return nil
}

// Referrers reads the referrers list PutReferrers stored for manifest subject of storage
// repository repo. ok is false when none is stored (or it cannot be read).
func (s *Store) Referrers(ctx context.Context, repo string, subject digest.Digest) (b []byte, ok bool) {
	b, err := s.driver.GetContent(ctx, ReferrersPath(repo, subject))
	if err != nil {
		if !isPathNotFound(err) {
			s.log.Warn().Err(err).Str("repository", repo).Str("subject", subject.String()).Msg("read stored referrers list")
		}
		return nil, false
	}
	return b, true
}

// DropReferrers deletes the referrers list stored for manifest subject of storage repository
// repo (one that does not parse, so that it is listed again).
func (s *Store) DropReferrers(ctx context.Context, repo string, subject digest.Digest) {
	if err := s.driver.Delete(ctx, ReferrersPath(repo, subject)); err != nil && !isPathNotFound(err) {
		s.log.Warn().Err(err).Str("repository", repo).Str("subject", subject.String()).Msg("delete stored referrers list")
	}
}
