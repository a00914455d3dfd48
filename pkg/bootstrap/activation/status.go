// Package activation answers "does the container runtime on this node really pull through the
// mirror?" from runtime evidence: which process serves the runtime socket and when it started,
// what configuration the running daemon loaded (containerd's introspection API, CRI status, or
// its start time against configuration mtimes), how containerd's own hosts.toml parser and
// containers/image's registries parser read the files on disk, and, when asked, what the
// mirror saw (client evidence, a canary pull).
//
// The evidence rules are in DESIGN.md ("containerd facts", "CRI-O facts", "Talos facts") and
// the answers and exit codes in its Contracts section.
package activation

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
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
	DefaultHostRoot       = "/"
	DefaultProcRoot       = "/proc"
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
	// HostRoot prefixes every host path (a pod with the host's / mounted at /host passes
	// "/host"). Default "/".
	HostRoot string
	// ProcRoot is the procfs of the host's pid namespace. Default "/proc" (a pod needs
	// hostPID).
	ProcRoot string
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
	// Upstreams are the registry names that must go through the mirror. Empty: every registry
	// with a nodecache-written hosts.toml or drop-in (Talos: every configured registry).
	Upstreams []string
	// Mirror is the mirror's URL (scheme://host:port) that must come first, and the endpoint
	// asked for client evidence. Nil: the first host of nodecache's own files, no traffic check.
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
	def(&o.HostRoot, DefaultHostRoot)
	def(&o.ProcRoot, DefaultProcRoot)
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
		n, err := mirror.NormalizeName(u)
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
	return errors.Join(errs...)
}

// ParseMirrorURL parses --mirror: http or https, a host, no path, query or credentials.
func ParseMirrorURL(s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("mirror %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		strings.Trim(u.Path, "/") != "" || u.RawQuery != "" {
		return nil, fmt.Errorf("mirror %q: want http://HOST:PORT or https://HOST:PORT", s)
	}
	u.Path = ""
	return u, nil
}

// evaluator holds one evaluation's inputs and collects its rows.
type evaluator struct {
	opts   Options
	proc   Proc
	report *Report
}

func (e *evaluator) add(runtime, name string, r Result, format string, args ...any) {
	e.report.Checks = append(e.report.Checks, Check{Runtime: runtime, Name: name, Result: r, Reason: fmt.Sprintf(format, args...)})
}

func (e *evaluator) warn(format string, args ...any) {
	e.report.Warnings = append(e.report.Warnings, fmt.Sprintf(format, args...))
}

func (e *evaluator) host(p string) string { return filepath.Join(e.opts.HostRoot, p) }

// Evaluate reads the evidence and returns the report. The error is only for options that are
// refused; evidence that cannot be read becomes an "unknown" row and, if decisive, the UNKNOWN
// state.
func Evaluate(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	e := &evaluator{opts: opts, proc: Proc{Root: opts.ProcRoot}, report: &Report{CheckedAt: opts.Now().UTC()}}
	talos, talosWhy := e.detectTalos()
	var rts []RuntimeReport
	switch {
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
	for i := range rts {
		e.traffic(ctx, &rts[i])
	}
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

// IsTalos reports whether the host under hostRoot is a Talos node (/etc/os-release ID=talos).
func IsTalos(hostRoot string) bool {
	ok, _ := detectTalos(hostRoot)
	return ok
}

func (e *evaluator) detectTalos() (bool, string) { return detectTalos(e.opts.HostRoot) }

func detectTalos(hostRoot string) (bool, string) {
	b, err := os.ReadFile(filepath.Join(hostRoot, "etc", "os-release"))
	if err != nil {
		return false, ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && k == "ID" && strings.Trim(v, `"'`) == "talos" {
			return true, "/etc/os-release says ID=talos"
		}
	}
	return false, ""
}

// upstreamsOr returns the configured upstreams, or found when none were configured.
func (e *evaluator) upstreamsOr(found []string) []string {
	if len(e.opts.Upstreams) > 0 {
		return e.opts.Upstreams
	}
	return found
}

// mtimeSecondsBefore reports whether a process that started at start (true start within
// [start, start+1s)) certainly started after a file modified at mtime: whole seconds, strictly
// (equal seconds count as not after).
func startedAfter(start, mtime time.Time) bool {
	return start.Unix() > mtime.Unix()
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
