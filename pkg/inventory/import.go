package inventory

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// ImportArgs is Import of the one bundle directory in args (ErrInput unless there is exactly
// one; a flag given after it is named, with where it goes).
func (c *Client) ImportArgs(ctx context.Context, args []string, ref string, progress io.Writer) (*Imported, error) {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("%w: argument %q looks like a flag: flags go before DIR, e.g. nodecache cache import --ref docker.io/library/alpine DIR", ErrInput, a)
		}
	}
	if len(args) != 1 {
		return nil, fmt.Errorf("%w: cache import takes one bundle DIR (an OCI image layout or a Talos image cache), got %s", ErrInput, clitext.Count(len(args), "argument"))
	}
	return c.Import(ctx, args[0], ref, progress)
}

// Import sends the bundle in dir (bundle.Open: an OCI image layout or a Talos image cache; ref
// names the images of a layout that does not, bundle.ReadOptions.Ref) to serve, which stores
// and pins its images (mirrorapi.CacheImportPath; serve accepts it from loopback and its --allow
// networks). First it asks serve which blobs it lacks (mirrorapi.CacheImportCheckPath), then
// reads every one of those and checks its digest, and only then sends them: a damaged bundle
// is refused before a byte of it is sent, and serve checks every blob again before it stores
// anything. progress (when not nil) gets a line per step.
//
// Errors: ErrInput for a directory that is not a bundle of a known layout, a ref it refuses or
// needs, an image of a registry serve has no upstream for (serve's 400); a *bundle.DamageError
// (bundle.ErrDamaged) naming each missing or damaged blob, or serve's 422 wrapping
// bundle.ErrDamaged; serve's refusal or failure; when nothing answers at the listen URL, the
// error asks whether serve runs there, as List's does.
func (c *Client) Import(ctx context.Context, dir, ref string, progress io.Writer) (*Imported, error) {
	say := func(format string, args ...any) {
		if progress != nil {
			_, _ = fmt.Fprintf(progress, "import: "+format+"\n", args...)
		}
	}
	b, err := bundle.Open(ctx, dir, bundle.ReadOptions{Ref: ref})
	if errors.Is(err, refusal.ErrRefused) {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	if err != nil {
		return nil, err
	}
	plan := b.Plan()
	body, err := json.Marshal(plan)
	if err != nil {
		return nil, fmt.Errorf("encode the import plan: %w", err)
	}
	var check mirrorapi.ImportCheck
	if err := c.send(ctx, c.http, http.MethodPost, mirrorapi.CacheImportCheckPath, "application/json", bytes.NewReader(body), &check); err != nil {
		return nil, err
	}
	want, bytesWanted := map[digest.Digest]bool{}, int64(0)
	for _, mb := range check.Missing {
		want[digest.Digest(mb.Digest)] = true
		bytesWanted += mb.Size
	}
	wanted := func(bl bundle.Blob) bool { return want[bl.Digest] }
	say("%s (%s): %s, %s, %s; serve lacks %d of them (%s): checking them", dir, b.Kind, clitext.Count(len(b.Images), "image"),
		clitext.Count(len(b.Manifests), "manifest"), clitext.Count(len(b.Blobs), "blob"), len(want), clitext.Bytes(bytesWanted))
	if err := b.Check(ctx, wanted); err != nil {
		return nil, err
	}
	say("sending %s (%s) to %s", clitext.Count(len(want), "blob"), clitext.Bytes(bytesWanted), c.base)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeImport(ctx, pw, body, b, wanted)) }()
	defer pr.Close()
	hc := *c.http
	hc.Timeout = 0 // a bundle takes as long as it takes; ctx ends it
	var res mirrorapi.ImportResult
	if err := c.send(ctx, &hc, http.MethodPost, mirrorapi.CacheImportPath, "application/x-tar", pr, &res); err != nil {
		return nil, err
	}
	return &Imported{ImportResult: res}, nil
}

// writeImport writes the import's tar stream to w: the plan (raw, JSON), then every blob of b
// that want accepts, as Each yields them (checked again as they are read).
func writeImport(ctx context.Context, w io.Writer, plan []byte, b *bundle.Reader, want func(bundle.Blob) bool) error {
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: mirrorapi.ImportPlanEntry, Mode: 0o644, Size: int64(len(plan)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(plan); err != nil {
		return err
	}
	err := b.Each(ctx, want, func(bl bundle.Blob, data io.Reader) error {
		hdr := &tar.Header{Name: mirrorapi.ImportBlobEntry(bl.Digest.String()), Mode: 0o644, Size: bl.Size, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := io.Copy(tw, data)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// Imported is `cache import`'s report: what serve stored.
type Imported struct{ mirrorapi.ImportResult }

// WriteJSON writes serve's answer.
func (i *Imported) WriteJSON(w io.Writer) error {
	return writeIndented(w, i.ImportResult)
}

// WriteText writes one line per image stored (UPSTREAM/REPOSITORY[:TAG]@DIGEST), then the
// totals.
func (i *Imported) WriteText(w io.Writer) error {
	for _, img := range i.Images {
		tag := ""
		if img.Tag != "" {
			tag = ":" + img.Tag
		}
		if _, err := fmt.Fprintf(w, "imported %s/%s%s@%s\n", img.Upstream, img.Repository, tag, img.Digest); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "%s, %s; %s stored (%s), %d already stored\n", clitext.Count(len(i.Images), "image"),
		clitext.Count(i.Manifests, "manifest"), clitext.Count(i.BlobsStored, "blob"), clitext.Bytes(i.BytesStored), i.BlobsPresent)
	return err
}
