package warm

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodecache/nodecache/internal/clitext"
)

// Report is the outcome of a warm run; `--output json` prints it as is.
type Report struct {
	// Mirror is the mirror's base URL (absent with warm --to).
	Mirror string `json:"mirror,omitempty"`
	// Routing is how requests named the upstream: "ns" or "path" (absent with warm --to).
	Routing Routing `json:"routing,omitempty"`
	// Bundle is the bundle written by warm --to; absent otherwise.
	Bundle *BundleReport `json:"bundle,omitempty"`
	// Platform is the platform walked, os/arch[/variant], or "all" (warm --to --platform all).
	Platform string `json:"platform"`
	// PlatformMatch is the rule that chose each index's manifest: "transfer" or "only".
	PlatformMatch PlatformMatch `json:"platform_match"`
	// Talos is the Talos join set when --talos chose the images.
	Talos *TalosJoinSet `json:"talos,omitempty"`
	// MirrorWaitSeconds is how long the mirror took to answer GET /v2/ (seconds); absent with
	// warm --to, which asks no mirror.
	MirrorWaitSeconds *float64 `json:"mirror_wait_seconds,omitempty"`
	// Images has one entry per image, in the order given.
	Images []ImageReport `json:"images"`
	// Warm is true only when every image is warm (with warm --to: stored whole in the bundle).
	Warm bool `json:"warm"`
	// BlobsFetched, BlobsFailed and BlobsExternal count distinct blobs over the run;
	// BlobsPresent (warm --to) those found in the bundle already, verified and not fetched.
	BlobsFetched  int `json:"blobs_fetched"`
	BlobsPresent  int `json:"blobs_present,omitempty"`
	BlobsFailed   int `json:"blobs_failed"`
	BlobsExternal int `json:"blobs_external"`
	// Bytes is the number of blob bytes received and verified (bytes).
	Bytes int64 `json:"bytes"`
	// Seconds is the wall-clock duration of the run, mirror wait included (seconds).
	Seconds float64 `json:"seconds"`
	// Error is set when the run could not walk at all (mirror not ready, or not nodecache serve
	// with --pin) or was stopped.
	Error string `json:"error,omitempty"`
	// Pin is true when --pin asked for each warm image to be pinned; PinnedImages counts those
	// pinned.
	Pin          bool `json:"pin,omitempty"`
	PinnedImages int  `json:"pinned_images,omitempty"`
}

// OK reports whether the run did all it was asked: every image warm, nothing stopped it, and with
// --pin every image pinned.
func (r *Report) OK() bool {
	return r.Warm && r.Error == "" && (!r.Pin || r.PinnedImages == len(r.Images)) && (r.Bundle == nil || r.Bundle.Written)
}

// ImageReport is the outcome for one image.
type ImageReport struct {
	// Input is the reference as given; Reference is its normalised form.
	Input     string `json:"input"`
	Reference string `json:"reference"`
	// Digest is the digest of the manifest the reference named (index or manifest).
	Digest string `json:"digest,omitempty"`
	// Manifest is the digest of the platform's image manifest that was walked.
	Manifest string `json:"manifest,omitempty"`
	// Platform is the index entry's platform that was chosen; empty for a single manifest,
	// which is walked as is.
	Platform string `json:"platform,omitempty"`
	// Warm is true when at least one blob was fetched and none failed; with warm --to, when
	// every blob is in the bundle (fetched now or present already) and none failed.
	Warm bool `json:"warm"`
	// Manifests counts manifests fetched; Skipped counts index entries not fetched (other
	// platforms, attestations).
	Manifests int `json:"manifests"`
	Skipped   int `json:"skipped"`
	// BlobsFetched, BlobsPresent (warm --to: in the bundle already), BlobsFailed,
	// BlobsExternal count this image's configs and layers.
	BlobsFetched  int `json:"blobs_fetched"`
	BlobsPresent  int `json:"blobs_present,omitempty"`
	BlobsFailed   int `json:"blobs_failed"`
	BlobsExternal int `json:"blobs_external"`
	// External lists foreign layers (with urls) that were reported, not fetched.
	External []ExternalBlob `json:"external,omitempty"`
	// Bytes is the size of the blobs fetched (bytes).
	Bytes int64 `json:"bytes"`
	// Seconds is how long this image took (seconds).
	Seconds float64 `json:"seconds"`
	// Cache counts the mirror's X-Nodecache-Cache answers (hit, miss, ...) over this image's
	// manifests and blobs; absent when the mirror sends none.
	Cache map[string]int `json:"cache,omitempty"`
	// Note is a remark on a warm image, e.g. a single manifest whose config names no platform
	// (walked without a platform check).
	Note string `json:"note,omitempty"`
	// Pinned is true when --pin pinned the image at the mirror once it was warm.
	Pinned bool `json:"pinned,omitempty"`
	// Error says why the image is not warm, or, with --pin, why a warm image is not pinned.
	Error string `json:"error,omitempty"`
}

// ExternalBlob is a foreign layer: it names URLs outside the registry and is not fetched.
type ExternalBlob struct {
	Digest string   `json:"digest"`
	Size   int64    `json:"size"`
	URLs   []string `json:"urls"`
}

// WriteJSON writes r as indented JSON with a trailing newline.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write json report: %w", err)
	}
	return nil
}

// WriteText writes the summary: a line per image (WARM or NOT WARM with counts, bytes, seconds,
// cache answers and the reason), external layers, then the totals.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	ok, notOK := "WARM", "NOT WARM"
	if r.Bundle != nil {
		ok, notOK = "STORED", "NOT STORED"
		fmt.Fprintf(&b, "%s, platform %s (match %s)\n", r.Bundle.describe(), r.Platform, r.PlatformMatch)
	} else {
		fmt.Fprintf(&b, "mirror %s (routing %s), platform %s (match %s)\n", r.Mirror, r.Routing, r.Platform, r.PlatformMatch)
	}
	if r.Talos != nil {
		fmt.Fprintf(&b, "talos %s join set, kubernetes %s\n", r.Talos.TalosVersion, r.Talos.KubernetesVersion)
		if r.Talos.Note != "" {
			fmt.Fprintf(&b, "note: %s\n", r.Talos.Note)
		}
	}
	if r.Error != "" {
		fmt.Fprintf(&b, "error: %s\n", r.Error)
	}
	warm := 0
	for _, im := range r.Images {
		state := notOK
		if im.Warm {
			state = ok
			warm++
		}
		im.writeText(&b, fmt.Sprintf("%-*s", len(notOK), state))
	}
	word := "warm"
	if r.Bundle != nil {
		word = "stored"
	}
	pinned := ""
	if r.Pin {
		pinned = fmt.Sprintf(" (%d pinned)", r.PinnedImages)
	}
	fmt.Fprintf(&b, "%d of %s %s%s; %s fetched", warm, clitext.Count(len(r.Images), "image"), word, pinned, clitext.Count(r.BlobsFetched, "blob"))
	if r.BlobsPresent > 0 {
		fmt.Fprintf(&b, ", %d in the bundle already", r.BlobsPresent)
	}
	fmt.Fprintf(&b, ", %d failed, %d external; %s in %s\n", r.BlobsFailed, r.BlobsExternal, clitext.Bytes(r.Bytes), clitext.Span(seconds(r.Seconds)))
	if r.Bundle != nil {
		b.WriteString(r.Bundle.outcome() + "\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// writeText writes the image's summary line after state (WARM, NOT STORED, ...) and its
// external layers, note and error below it.
func (im *ImageReport) writeText(b *strings.Builder, state string) {
	name := im.Reference
	if im.Input != "" && im.Input != im.Reference {
		name += " (from " + im.Input + ")"
	}
	fmt.Fprintf(b, "%s %s", state, name)
	if im.Platform != "" {
		fmt.Fprintf(b, " %s", im.Platform)
	}
	fmt.Fprintf(b, ": %s fetched", clitext.Count(im.BlobsFetched, "blob"))
	if im.BlobsPresent > 0 {
		fmt.Fprintf(b, ", %d in the bundle already", im.BlobsPresent)
	}
	fmt.Fprintf(b, ", %d failed", im.BlobsFailed)
	if im.BlobsExternal > 0 {
		fmt.Fprintf(b, ", %d external", im.BlobsExternal)
	}
	fmt.Fprintf(b, ", %s in %s", clitext.Bytes(im.Bytes), clitext.Span(seconds(im.Seconds)))
	if len(im.Cache) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(im.Cache)) {
			parts = append(parts, fmt.Sprintf("%s=%d", k, im.Cache[k]))
		}
		fmt.Fprintf(b, ", cache %s", strings.Join(parts, " "))
	}
	if im.Pinned {
		b.WriteString(", pinned")
	}
	b.WriteString("\n")
	for _, e := range im.External {
		fmt.Fprintf(b, "  external %s %s, not fetched: %s\n", e.Digest, clitext.Bytes(e.Size), strings.Join(e.URLs, " "))
	}
	if im.Note != "" {
		fmt.Fprintf(b, "  note: %s\n", im.Note)
	}
	if im.Error != "" {
		fmt.Fprintf(b, "  error: %s\n", im.Error)
	}
}

// seconds turns a report's seconds back into a duration for text output.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
