// Package activation answers "does the container runtime on this node really pull through the
// mirror?" from runtime evidence: which process serves the runtime socket and when it started,
// whether its CRI plugin loaded and what configuration it loaded (containerd's introspection
// API, CRI status, or its start time against configuration mtimes), how containerd's own
// hosts.toml parser and containers/image's registries parser read the files on disk, and, when
// asked, what the mirror saw (client evidence, a canary pull). Every file, link, socket and
// process is read through one bootstrap.Host.
//
// Verdict rules (docs/status.md, "Verdict rules"; docs/contracts.md, "Status verdicts"):
//   - Active (exit 0) only when the evidence shows this runtime's pulls go through a reachable
//     mirror. Without Options.Mirror the reason says reachability was not checked; with it, a
//     mirror that does not answer is NotActive.
//   - NotActive (exit 1): the CRI plugin failed to load (introspection's plugin list, 1.x and
//     2.x), a configuration the runtime refuses, a daemon that has not loaded the current files
//     (the start-time rule, see StartOrder), files that do not put the mirror first, an
//     unreachable mirror.
//   - Unknown (exit 3): the runtime's API unreachable or permission denied, evidence unreadable,
//     no daemon visible next to its configuration, hosts.toml files that put a host other than
//     the registry first while nothing tells which host is the mirror (no Options.Mirror, no
//     file nodecache wrote or adopted). Never Active without runtime evidence.
//   - Which hosts.toml files count (containerd, Talos): Options.Upstreams, else every registry
//     whose file nodecache wrote or adopted or that names the mirror as containerd's
//     ConfigureHosts reads it; a site's file that does not name it is listed, not judged.
//   - On Talos only, the hosts Talos puts first while its image cache is on (registryd,
//     talosImageCache) are not judged: the mirror must be the first host after them.
//   - The start-time rule (StartOrder, shared with gen's restart_required): loaded when the
//     daemon started at least StartTolerance (10 ms) after the last change; ambiguous within
//     ±10 ms (NotActive); changed after otherwise. Start times are exact to one clock tick
//     (boot time from CLOCK_REALTIME − CLOCK_BOOTTIME).
//   - Traffic evidence settles only what the start-time rule held back: a GET or HEAD of a
//     manifest or blob answered 200/206 to the runtime's user-agent family from this node since
//     the daemon started, on this node's clock (corrected by the mirror's offset). Pings,
//     errors and other paths never count.
package activation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Runtime names accepted by Options.Runtime.
const (
	RuntimeAuto       = "auto"
	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "crio"
	RuntimeTalos      = "talos"
)

// Defaults for Options.
const (
	DefaultHostRoot       = bootstrap.DefaultHostRoot
	DefaultProcRoot       = bootstrap.DefaultProcRoot
	DefaultCRIOSocket     = "/var/run/crio/crio.sock"
	DefaultRegistriesDir  = "/etc/containers/registries.conf.d"
	DefaultRegistriesConf = "/etc/containers/registries.conf"
	DefaultCRIOConfig     = "/etc/crio/crio.conf"
	DefaultCRIODropInDir  = "/etc/crio/crio.conf.d"
	DefaultTalosHostsDir  = "/etc/cri/conf.d/hosts"
	// DefaultAPITimeout bounds each call to a runtime socket.
	DefaultAPITimeout = 5 * time.Second
)

// Options says where to look. Paths are host paths: they are read under HostRoot.
type Options struct {
	// Runtime is auto (default), containerd, crio or talos. auto detects Talos first (its
	// /etc/os-release), else examines containerd and CRI-O and counts those present.
	Runtime string
	// Host is the view of the node every file, link, socket and process is read through
	// (--host-root and the proc root). Default: bootstrap.NewHost with its defaults (/ and
	// /proc).
	Host *bootstrap.Host
	// ContainerdConfig is containerd's main config file. Default: the --config/-c of the
	// daemon serving ContainerdSocket, else /etc/containerd/config.toml.
	ContainerdConfig string
	// ContainerdSocket is the socket of the containerd that serves the kubelet. Default
	// /run/containerd/containerd.sock.
	ContainerdSocket string
	// CRIOSocket is CRI-O's socket (canary pulls). Default /var/run/crio/crio.sock.
	CRIOSocket string
	// RegistriesConf and RegistriesDir are containers/image's registries.conf and its drop-in
	// directory. Defaults /etc/containers/registries.conf and .../registries.conf.d.
	RegistriesConf, RegistriesDir string
	// CRIOConfig and CRIODropInDir are crio.conf and its drop-in directory. Defaults
	// /etc/crio/crio.conf and /etc/crio/crio.conf.d.
	CRIOConfig, CRIODropInDir string
	// TalosHostsDir is where Talos writes hosts.toml files. Default /etc/cri/conf.d/hosts.
	TalosHostsDir string
	// Upstreams are the registry names that must go through the mirror. Empty: containerd and
	// Talos judge every registry whose hosts.toml nodecache wrote (mirrorapi.ManagedMarker) or
	// adopted (gen's marked block in a site's file) or names the mirror as containerd's
	// ConfigureHosts reads it — who wrote a file does not matter, what containerd does with it
	// does; CRI-O judges the prefixes of nodecache's drop-in.
	Upstreams []string
	// Mirror is the mirror's URL (scheme://host:port) that must come first, and the endpoint
	// asked for client evidence. Nil: the mirror of nodecache's own and adopted files, no
	// traffic check; with neither, a file that puts another host first is Unknown ("pass
	// --mirror").
	Mirror *url.URL
	// Canary pulls a fresh canary image through the runtime's CRI socket (needs Mirror).
	Canary bool
	// CanaryUpstream is the upstream under which the canary repository is pulled. Default: the
	// first upstream examined.
	CanaryUpstream string
	// HTTPClient talks to the mirror. Default: a client with a 10 s timeout.
	HTTPClient *http.Client
	// APITimeout bounds each runtime socket call. Default DefaultAPITimeout.
	APITimeout time.Duration
	// NodeAddrs lists this node's addresses for client evidence. Default: every interface
	// address plus loopback.
	NodeAddrs func() ([]netip.Addr, error)
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives debug detail. Default: disabled.
	Logger zerolog.Logger
}

// setDefaults fills in the defaults of o and checks the rest; every problem is reported, as one
// refusal (refusal.ErrRefused) of them joined.
func (o *Options) setDefaults() error {
	var errs []error
	switch o.Runtime {
	case "":
		o.Runtime = RuntimeAuto
	case RuntimeAuto, RuntimeContainerd, RuntimeCRIO, RuntimeTalos:
	default:
		errs = append(errs, fmt.Errorf("runtime %q: want auto, containerd, crio or talos", o.Runtime))
	}
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	if o.Host == nil {
		h, err := bootstrap.NewHost(bootstrap.HostOptions{})
		if err != nil {
			errs = append(errs, err)
		}
		o.Host = h
	}
	def(&o.CRIOSocket, DefaultCRIOSocket)
	def(&o.RegistriesConf, DefaultRegistriesConf)
	def(&o.RegistriesDir, DefaultRegistriesDir)
	def(&o.CRIOConfig, DefaultCRIOConfig)
	def(&o.CRIODropInDir, DefaultCRIODropInDir)
	def(&o.TalosHostsDir, DefaultTalosHostsDir)
	for name, p := range map[string]string{"containerd-config": o.ContainerdConfig, "containerd-socket": o.ContainerdSocket} {
		if p != "" && !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("%s %q: want an absolute host path", name, p))
		}
	}
	if o.Mirror != nil {
		if (o.Mirror.Scheme != "http" && o.Mirror.Scheme != "https") || o.Mirror.Host == "" {
			errs = append(errs, fmt.Errorf("mirror %q: want http://HOST:PORT or https://HOST:PORT", o.Mirror))
		}
	}
	if o.Canary && o.Mirror == nil {
		errs = append(errs, errors.New("canary: needs the mirror URL (--mirror)"))
	}
	for i, u := range o.Upstreams {
		n, err := name.ParseRegistry(u)
		if err != nil {
			errs = append(errs, fmt.Errorf("upstreams[%d]: %w", i, err))
		}
		o.Upstreams[i] = n
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if o.APITimeout <= 0 {
		o.APITimeout = DefaultAPITimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if err := errors.Join(errs...); err != nil {
		return &refusal.Error{Reason: err.Error(), Err: err}
	}
	return nil
}

// evaluator holds one evaluation's inputs and collects its rows.
type evaluator struct {
	opts   Options
	h      *bootstrap.Host
	report *Report
}

func (e *evaluator) add(runtime, name string, r Result, format string, args ...any) {
	e.report.Checks = append(e.report.Checks, Check{Runtime: runtime, Name: name, Result: r, Reason: fmt.Sprintf(format, args...)})
}

func (e *evaluator) warn(format string, args ...any) {
	e.report.Warnings = append(e.report.Warnings, fmt.Sprintf(format, args...))
}

// Evaluate reads the evidence and returns the report. The error is only for options that are
// refused (refusal.ErrRefused); evidence that cannot be read becomes an "unknown" row and, if decisive, the UNKNOWN
// state.
func Evaluate(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	e := &evaluator{opts: opts, h: opts.Host, report: &Report{CheckedAt: opts.Now().UTC()}}
	talos, talosWhy, talosErr := e.detectTalos()
	var rts []RuntimeReport
	switch {
	case opts.Runtime == RuntimeTalos && !talos:
		rts = append(rts, e.noTalos(talosWhy, talosErr))
	case opts.Runtime == RuntimeTalos || (opts.Runtime == RuntimeAuto && talos):
		if opts.Runtime == RuntimeAuto {
			e.add(RuntimeTalos, "detect", Info, "%s", talosWhy)
		}
		rts = append(rts, e.talos(ctx))
	case opts.Runtime == RuntimeContainerd:
		rts = append(rts, e.containerd(ctx))
	case opts.Runtime == RuntimeCRIO:
		rts = append(rts, e.crio(ctx))
	default:
		rts = append(rts, e.containerd(ctx), e.crio(ctx))
	}
	e.traffic(ctx, rts)
	e.peers(ctx)
	e.upstreams(ctx)
	if opts.Canary {
		for i := range rts {
			if rts[i].State != NotApplicable {
				e.canary(ctx, &rts[i])
			}
		}
	}
	e.report.Runtimes = rts
	e.report.State, e.report.Reason = combine(rts)
	return e.report, nil
}

// IsTalos reports whether the host is a Talos node (/etc/os-release ID=talos).
func IsTalos(h *bootstrap.Host) bool {
	ok, _, _ := detectTalos(h)
	return ok
}

func (e *evaluator) detectTalos() (bool, string, error) { return detectTalos(e.h) }

// detectTalos reads the host's /etc/os-release; why says what it found either way. err is set
// only when the file exists but cannot be read.
func detectTalos(h *bootstrap.Host) (talos bool, why string, err error) {
	b, err := h.ReadFile("/etc/os-release")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, "there is no /etc/os-release", nil
	case err != nil:
		return false, "", fmt.Errorf("read /etc/os-release: %w", err)
	}
	id := ""
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && k == "ID" {
			id = strings.Trim(v, `"'`)
		}
	}
	switch id {
	case "talos":
		return true, "/etc/os-release says ID=talos", nil
	case "":
		return false, "/etc/os-release has no ID", nil
	}
	return false, fmt.Sprintf("/etc/os-release says ID=%s", id), nil
}

// noTalos is the verdict for --runtime talos on a host that is not Talos: not applicable
// (exit 3: there is no Talos whose configuration could be judged), or unknown when
// /etc/os-release could not be read.
func (e *evaluator) noTalos(why string, err error) RuntimeReport {
	rep := RuntimeReport{Runtime: RuntimeTalos}
	if err != nil {
		e.add(RuntimeTalos, "detect", Unread, "%v", err)
		rep.State, rep.Reason = Unknown, fmt.Sprintf("cannot tell whether the host under --host-root %s is Talos: %v", e.h.Root(), err)
		return rep
	}
	e.add(RuntimeTalos, "detect", Skipped, "--runtime talos, but %s", why)
	rep.State = NotApplicable
	rep.Reason = fmt.Sprintf("no Talos found under --host-root %s: %s", e.h.Root(), why)
	return rep
}

// explicitNone is the not-applicable reason for a runtime that was asked for by name but is not
// on this node, or "" when the runtime was not asked for by name.
func (e *evaluator) explicitNone(runtime, name, found string) string {
	if e.opts.Runtime != runtime {
		return ""
	}
	return fmt.Sprintf("no %s found under --host-root %s: %s", name, e.h.Root(), found)
}

// ambiguousStart is the reason and remedy when a runtime daemon started within StartTolerance
// of its configuration's last change (ev.Order == Ambiguous): the rule counts that as not
// loaded, but either order is possible. Traffic evidence (a pull of this daemon seen by the
// mirror) decides it; mirror is the URL to name for that (see mirrorHint). detail, when set, is
// added to the reason; fix is the runtime's usual restart remedy, kept word for word.
func ambiguousStart(ev *RestartEvidence, daemon, restart, fix, detail, mirror string) (reason, remedy string) {
	if detail != "" {
		detail = "; " + detail
	}
	reason = fmt.Sprintf("%s%s — %s again, or let a pull prove it: nodecache status --mirror %s",
		ev.Reason(daemon), detail, restart, mirror)
	remedy = fmt.Sprintf("%s; or pull any image on this node and run nodecache status --mirror %s: a pull the mirror saw since %s started proves it active (the agent checks this every --interval)",
		fix, mirror, daemon)
	return reason, remedy
}

// mirrorHint is the mirror URL to suggest: Options.Mirror, else the mirror of the hosts.toml
// files nodecache wrote or adopted under roots, else a placeholder.
func (e *evaluator) mirrorHint(ctx context.Context, roots []string) string {
	if e.opts.Mirror != nil {
		return e.opts.Mirror.String()
	}
	if files, err := scanHosts(ctx, e.h, roots, nil); err == nil {
		if m := mirrorsOf(nil, files).list(); len(m) > 0 {
			return m[0]
		}
	}
	return "http://HOST:PORT"
}

// upstreamsOr returns the configured upstreams, or found when none were configured.
func (e *evaluator) upstreamsOr(found []string) []string {
	if len(e.opts.Upstreams) > 0 {
		return e.opts.Upstreams
	}
	return found
}
