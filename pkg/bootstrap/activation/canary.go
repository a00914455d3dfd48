package activation

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// The canary: the runtime pulls, through its CRI socket exactly as the kubelet does, an image
// that only the mirror serves — the reserved repository mirrorapi.CanaryRepository under a configured
// upstream, with a fresh tag per run (no upstream has it, no cache holds it) — and the image is
// removed afterwards. A pull that succeeds, and that the mirror saw from this node's runtime,
// proves the path end to end; a pull that fails proves the runtime does not use the mirror for
// that upstream (or the mirror is down).

// DefaultCanaryTimeout bounds the canary pull.
const DefaultCanaryTimeout = 2 * time.Minute

// CanaryRef returns the reference pulled for upstream with tag.
func CanaryRef(upstream, tag string) string {
	return upstream + "/" + mirrorapi.CanaryRepository + ":" + tag
}

func newCanaryTag(now time.Time) (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("canary tag: %w", err)
	}
	return fmt.Sprintf("c%d-%s", now.Unix(), hex.EncodeToString(b)), nil
}

func (e *evaluator) criSocket(runtime string) string {
	if runtime == RuntimeCRIO {
		return e.opts.CRIOSocket
	}
	if e.opts.ContainerdSocket != "" {
		return e.opts.ContainerdSocket
	}
	return bcontainerd.DefaultSocket
}

// canary pulls a fresh canary image through the runtime's CRI socket and removes it.
func (e *evaluator) canary(ctx context.Context, rep *RuntimeReport) {
	rt := rep.Runtime
	up := e.opts.CanaryUpstream
	if up == "" && len(rep.upstreams) > 0 {
		up = rep.upstreams[0]
	}
	if up == "" && len(e.opts.Upstreams) > 0 {
		up = e.opts.Upstreams[0]
	}
	if up == "" {
		e.add(rt, "canary", Skipped, "no upstream to pull the canary under (none configured or found)")
		return
	}
	begin := e.opts.Now()
	tag, err := newCanaryTag(begin)
	if err != nil {
		e.add(rt, "canary", Unread, "%v", err)
		return
	}
	ref := CanaryRef(up, tag)
	if !e.pullCanary(ctx, rep, ref) {
		return
	}
	e.canarySeen(ctx, rep, ref, begin)
}

// pullCanary is the pull step: ref pulled through the runtime's CRI socket, then removed again
// (a leftover is reported, not fatal). Not ok: the socket does not answer, or the pull failed and
// the report is NotActive.
func (e *evaluator) pullCanary(ctx context.Context, rep *RuntimeReport, ref string) bool {
	rt := rep.Runtime
	socket := e.criSocket(rt)
	local, err := e.h.Local(socket)
	if err != nil {
		e.add(rt, "canary", Unread, "CRI socket %s: %v", socket, err)
		return false
	}
	conn, err := grpc.NewClient("unix://"+local, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.add(rt, "canary", Unread, "CRI socket %s: %v", socket, err)
		return false
	}
	defer conn.Close()
	images := runtimeapi.NewImageServiceClient(conn)
	pctx, cancel := context.WithTimeout(ctx, DefaultCanaryTimeout)
	resp, err := images.PullImage(pctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	cancel()
	if err != nil {
		if unreachable(err) && pctx.Err() == nil {
			e.add(rt, "canary", Unread, "CRI socket %s does not answer: %v", socket, err)
			return false
		}
		e.add(rt, "canary", Fail, "CRI pull of %s (only the mirror serves it) failed: %v", ref, err)
		rep.State = NotActive
		rep.Reason = "the canary pull of " + ref + " did not succeed through the mirror"
		if rep.Remedy == "" {
			rep.Remedy = "check the mirror is serving, then the runtime configuration rows above"
		}
		return false
	}
	// Remove it again; a leftover is reported, not fatal.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.APITimeout)
	_, rerr := images.RemoveImage(rctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: resp.GetImageRef()}})
	cancel()
	if rerr != nil {
		e.add(rt, "canary-cleanup", Warn, "could not remove the canary image %s (%s): %v", ref, resp.GetImageRef(), rerr)
		e.warn("%s: canary image %s left behind: %v", rt, ref, rerr)
	}
	return true
}

// canarySeen is the mirror step: the mirror must have seen this runtime since the pull began.
func (e *evaluator) canarySeen(ctx context.Context, rep *RuntimeReport, ref string, begin time.Time) {
	rt := rep.Runtime
	fam := runtimeFamily(rt)
	doc, err := FetchClientEvidence(ctx, e.opts.HTTPClient, e.opts.Mirror)
	if err != nil {
		e.add(rt, "canary", Unread, "pulled %s, but the mirror's client evidence is unreadable: %v", ref, err)
		return
	}
	addrs, err := e.addrs()
	if err != nil {
		e.add(rt, "canary", Unread, "%v", err)
		return
	}
	s, ok := findSighting(doc, addrs, fam)
	if !ok || s.Local.Before(begin.Add(-doc.Skew.Max+doc.Skew.Min)) {
		e.add(rt, "canary", Fail, "pulled %s, but the mirror saw no %s request from this node during the pull", ref, fam)
		rep.State = NotActive
		rep.Reason = "the canary pull did not reach the mirror"
		return
	}
	e.add(rt, "canary", Pass, "pulled %s through the CRI socket; the mirror served %s content to %s at %s (mirror clock)", ref, fam, s.Address, fmtPrecise(s.Last))
	if rep.State == Unknown || (rep.State == NotActive && rep.startTimeOnly) {
		rep.State, rep.Remedy = Active, ""
		rep.Reason = "a canary pull through the CRI socket went through the mirror"
	}
}
