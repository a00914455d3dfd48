package activation

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// MirrorRow is the Runtime of the rows that speak of the mirror itself rather than a runtime
// (a failing upstream).
const MirrorRow = "mirror"

// FetchUpstreams reads the mirror's upstream health (mirrorapi.UpstreamsPath): nil without error
// when the mirror does not serve it (404: a nodecache from before issue 25).
//
// Errors: no answer, a status other than 200 and 404, a body that is not the document.
func FetchUpstreams(ctx context.Context, client *http.Client, mirrorURL *url.URL) (*mirrorapi.Upstreams, error) {
	var doc mirrorapi.Upstreams
	if found, err := fetchMirrorDoc(ctx, client, mirrorURL, mirrorapi.UpstreamsPath, "upstream health", &doc); !found || err != nil {
		return nil, err
	}
	return &doc, nil
}

// fetchMirrorDoc GETs the mirror's JSON document at path (one of mirrorapi's /nodecache/v1/
// paths) into doc (8 MiB at most); found is false, without error, when the mirror answers 404
// (a nodecache without it). what names the document in errors.
//
// Errors: no answer, a status other than 200 and 404 (with up to 512 bytes of its body), a body
// that is not the document.
func fetchMirrorDoc(ctx context.Context, client *http.Client, mirrorURL *url.URL, path, what string, doc any) (found bool, err error) {
	u := *mirrorURL
	u.Path, u.RawQuery = path, ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", what, u.Redacted(), err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", what, u.Redacted(), err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return false, nil
	default:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return false, fmt.Errorf("%s %s: HTTP %d: %s", what, u.Redacted(), resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(doc); err != nil {
		return false, fmt.Errorf("%s %s: not the expected JSON: %w", what, u.Redacted(), err)
	}
	return true, nil
}

// FailingUpstreams are the reasons of the warning rows for doc: one per upstream with a failing
// tier (its last exchange failed: mirrorapi.TierHealth.Failing), naming each such tier's last
// failure and its cause, its failures by reason, its last success, and the announced rate limit.
// Times are told as spans before doc.Now (the mirror's clock).
func FailingUpstreams(doc *mirrorapi.Upstreams) []string {
	var out []string
	for _, u := range doc.Upstreams {
		var parts []string
		for _, th := range u.Tiers {
			if !th.Failing || th.LastFailure == nil {
				continue
			}
			parts = append(parts, fmt.Sprintf("tier %s: last exchange failed %s ago (%s: %s); failures %s; last success %s",
				th.Tier, clitext.Span(doc.Now.Sub(th.LastFailure.Time).Round(time.Second)), th.LastFailure.Reason, th.LastFailure.Cause,
				byReason(th.Failures), successText(doc.Now, th.LastSuccess)))
		}
		if len(parts) == 0 {
			continue
		}
		s := fmt.Sprintf("upstream %s is failing: %s", u.Name, strings.Join(parts, "; "))
		if rl := u.RateLimit; rl != nil {
			s += fmt.Sprintf("; rate limit: %d pulls left in its %s window", rl.Remaining, clitext.Span(time.Duration(rl.WindowSeconds)*time.Second))
		}
		out = append(out, s)
	}
	return out
}

// byReason is failures as "reason N, reason N" by reason.
func byReason(failures map[string]int64) string {
	reasons := make([]string, 0, len(failures))
	for r := range failures {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	var b strings.Builder
	for i, r := range reasons {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", r, failures[r])
	}
	return b.String()
}

func successText(now, t time.Time) string {
	if t.IsZero() {
		return "never since the mirror started"
	}
	return clitext.Span(now.Sub(t).Round(time.Second)) + " ago"
}

// upstreams adds a warning row per failing upstream of the mirror (with --mirror); never part
// of the verdict (the runtime's pulls still go through the mirror), and a mirror that cannot
// tell is a warning at most.
func (e *evaluator) upstreams(ctx context.Context) {
	if e.opts.Mirror == nil {
		return
	}
	doc, err := FetchUpstreams(ctx, e.opts.HTTPClient, e.opts.Mirror)
	switch {
	case err != nil:
		e.warn("%v", err)
		return
	case doc == nil:
		return
	}
	for _, reason := range FailingUpstreams(doc) {
		e.add(MirrorRow, "upstream", Warn, "%s", reason)
	}
}
