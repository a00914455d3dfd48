package activation

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// remedyRestartContainerd is the remedy when containerd has not loaded a correct config_path:
// config_path is read only at daemon start, containerd has no reload, and nodecache never
// restarts or signals it (containerd docs/cri/registry.md: a change of config.toml needs a
// restart; docs/contracts.md, "Readiness and activation": what the agent never does).
const remedyRestartContainerd = "restart containerd or cycle the node (nodecache never restarts containerd)"

// ContainerdDaemon is the containerd process serving a socket and how it was recognised.
type ContainerdDaemon struct {
	bootstrap.Process
	// Socket is the socket it serves (host path).
	Socket string
	// How says how it was picked ("holds the listening socket … (inode N)", or the command-line
	// fallback when its descriptors cannot be read).
	How string
}

// FindContainerd finds the containerd process serving socket (a host path, as the daemon sees
// it) among the processes named containerd: the one holding the listening socket bound there
// (found by inode in its network namespace's socket table, so Talos' two daemons are told
// apart); for a process whose descriptors may not be read, the address it was told (--address,
// else its config's grpc address, else containerd's default). nil, nil when no process is named
// containerd; an error when some are but none (or several) serve socket.
func FindContainerd(h *bootstrap.Host, socket string) (*ContainerdDaemon, error) {
	procs, err := h.Processes("containerd")
	if err != nil || len(procs) == 0 {
		return nil, err
	}
	var (
		matches []ContainerdDaemon
		noFD    []bootstrap.Process
	)
	for _, p := range procs {
		ok, inode, err := h.ListensOn(p.PID, socket)
		switch {
		case errors.Is(err, bootstrap.ErrNoFDAccess):
			noFD = append(noFD, p)
		case err != nil:
			return nil, err
		case ok:
			matches = append(matches, ContainerdDaemon{Process: p, Socket: socket,
				How: fmt.Sprintf("holds the listening socket %s (inode %d)", socket, inode)})
		}
	}
	// Fallback for processes whose descriptors may not be read: the address they were told.
	for _, p := range noFD {
		args, err := h.Cmdline(p.PID)
		if bootstrap.Exited(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		addr, how := "", ""
		if a, ok := flagValue(args, "address", "a"); ok {
			addr, how = a, "its command line says --address "+a
		} else {
			cfgPath := bcontainerd.DefaultConfig
			if c, ok := flagValue(args, "config", "c"); ok {
				cfgPath = c
			}
			addr, how = bcontainerd.DefaultSocket, "containerd's default address"
			if eff, err := bcontainerd.Load(h.FS(), cfgPath, bcontainerd.LoadOptions{}); err == nil && eff.GRPCAddress != bcontainerd.DefaultSocket {
				addr, how = eff.GRPCAddress, "the grpc address in "+cfgPath
			}
		}
		if addr == socket {
			matches = append(matches, ContainerdDaemon{Process: p, Socket: socket,
				How: how + " (descriptors not readable, so the socket owner could not be checked)"})
		}
	}
	switch len(matches) {
	case 1:
		return &matches[0], nil
	case 0:
		var pids []string
		for _, p := range procs {
			pids = append(pids, itoa(p.PID))
		}
		return nil, fmt.Errorf("none of the containerd processes (pid %s) serves %s (--containerd-socket): give the socket of the containerd that serves the kubelet", strings.Join(pids, ", "), socket)
	default:
		return nil, fmt.Errorf("%d containerd processes claim %s", len(matches), socket)
	}
}

// loadedView is the registry configuration a containerd daemon runs with.
type loadedView struct {
	configPath string
	known      bool
	source     string // introspection, cri-status, start-time
}

// containerd examines the containerd that serves ContainerdSocket: its process, its
// configuration, its API and CRI plugin, the config_path it has loaded, and the hosts.toml
// files under it.
func (e *evaluator) containerd(ctx context.Context) RuntimeReport {
	const rt = RuntimeContainerd
	rep := RuntimeReport{Runtime: rt}
	socket := e.opts.ContainerdSocket
	if socket == "" {
		socket = bcontainerd.DefaultSocket
	}

	target, err := FindContainerd(e.h, socket)
	if err != nil {
		e.add(rt, "process", Unread, "%v", err)
		rep.State, rep.Reason = Unknown, "cannot tell which containerd serves "+socket+": "+err.Error()
		return rep
	}
	cfgPath, cfgFrom := e.containerdConfigPath(target)
	// The files first with the newest 2.x rules (which files, their mtimes); read again below
	// with the rules of the release that answers on the socket.
	eff, cfgErr := bcontainerd.Load(e.h.FS(), cfgPath, bcontainerd.LoadOptions{})
	if !e.containerdProcess(&rep, target, cfgPath, cfgErr == nil && !eff.Exists) {
		return rep
	}
	if cfgErr != nil {
		return e.configError(rep, cfgErr)
	}
	e.containerdConfigInfo(eff, cfgPath, cfgFrom)

	// What the daemon says. No answer on its socket: no runtime evidence, so UNKNOWN.
	local, err := e.h.Local(socket)
	if err != nil {
		e.add(rt, "version", Unread, "%s: %v", socket, err)
		rep.State, rep.Reason = Unknown, fmt.Sprintf("cannot reach containerd's API at %s: %v", socket, err)
		return rep
	}
	client, err := dialContainerd(local)
	if err != nil {
		e.add(rt, "version", Unread, "%s: %v", socket, err)
		rep.State, rep.Reason = Unknown, fmt.Sprintf("cannot reach containerd's API at %s: %v", socket, err)
		return rep
	}
	defer client.Close()
	raw, release, ok := e.containerdVersion(ctx, &rep, client, socket, target)
	if !ok || !e.criPlugin(ctx, &rep, client, eff) {
		return rep
	}

	// The effective configuration as this release reads it.
	if eff, err = bcontainerd.Load(e.h.FS(), cfgPath, bcontainerd.LoadOptions{Daemon: release}); err != nil {
		return e.configError(rep, err)
	}
	restart := Judge(target.Process, configTimes(eff))
	view := e.loadedConfigPath(ctx, client, release, raw)
	onDisk := eff.ConfigPath
	// The registries the on-disk files route through the mirror: what a canary pulls under
	// when the verdict is decided before the hosts check (a daemon that has not loaded them
	// yet is exactly where the canary's answer matters).
	rep.upstreams = e.upstreamsOr(e.onDiskRegistries(ctx, onDisk))
	if !view.known {
		if view, ok = e.startTimeView(ctx, &rep, restart, onDisk); !ok {
			return rep
		}
	}
	rep.Evidence = view.source
	loaded := view.configPath
	rep.LoadedConfigPath = &loaded
	if view.source != "start-time" {
		e.pendingChange(&rep, restart, loaded, onDisk)
	}
	roots, ok := e.configPathUse(&rep, eff, loaded, onDisk)
	if !ok {
		return rep
	}
	return e.judgeHosts(ctx, rep, rt, roots)
}

// containerdConfigPath is the config file of the containerd at target and where that comes
// from: --containerd-config, the daemon's --config, or the default.
func (e *evaluator) containerdConfigPath(target *ContainerdDaemon) (cfgPath, cfgFrom string) {
	cfgPath, cfgFrom = e.opts.ContainerdConfig, "--containerd-config"
	if cfgPath == "" && target != nil {
		if args, err := e.h.Cmdline(target.PID); err == nil {
			if c, ok := flagValue(args, "config", "c"); ok {
				cfgPath, cfgFrom = c, "the daemon's --config"
			}
		}
	}
	if cfgPath == "" {
		cfgPath, cfgFrom = bcontainerd.DefaultConfig, "default"
	}
	return cfgPath, cfgFrom
}

// containerdProcess is the process step: a containerd serves the socket, or the report says
// why not (no containerd at all, or a configuration without a visible process).
func (e *evaluator) containerdProcess(rep *RuntimeReport, target *ContainerdDaemon, cfgPath string, cfgMissing bool) bool {
	const rt = RuntimeContainerd
	if target == nil {
		if cfgMissing {
			rep.State, rep.Reason = NotApplicable, fmt.Sprintf("no containerd process and no %s", cfgPath)
			if r := e.explicitNone(rt, "containerd", fmt.Sprintf("no process named containerd under %s and no %s", e.h.ProcRoot(), cfgPath)); r != "" {
				rep.Reason = r
			}
			e.add(rt, "process", Skipped, "no process named containerd; no config at %s", cfgPath)
			return false
		}
		e.add(rt, "process", Unread, "no process named containerd under %s (a pod needs hostPID), but %s exists", e.h.ProcRoot(), cfgPath)
		rep.State, rep.Reason = Unknown, "containerd configuration present but no containerd process is visible"
		return false
	}
	rep.PID = target.PID
	start := target.Start
	rep.ProcessStart = &start
	e.add(rt, "process", Pass, "pid %d %s; started %s", target.PID, target.How, fmtPrecise(start))
	return true
}

// containerdConfigInfo records the configuration files read (or that there are none).
func (e *evaluator) containerdConfigInfo(eff *bcontainerd.Effective, cfgPath, cfgFrom string) {
	const rt = RuntimeContainerd
	if !eff.Exists {
		e.add(rt, "config", Info, "%s (%s) does not exist: containerd runs on built-in defaults", e.h.Display(cfgPath), cfgFrom)
		return
	}
	var names []string
	for _, f := range eff.Files {
		names = append(names, e.h.Display(f.Path))
	}
	newest := eff.Newest()
	e.add(rt, "config", Info, "%s (%s), schema version %d, newest change %s at %s", strings.Join(names, " + "), cfgFrom, eff.Schema, newest.Path, fmtPrecise(newest.ModTime))
}

// containerdVersion is the version step: the release the daemon's version service reports, or
// (no answer) its build information and an Unknown report.
func (e *evaluator) containerdVersion(ctx context.Context, rep *RuntimeReport, client *containerdClient, socket string, target *ContainerdDaemon) (string, bcontainerd.Release, bool) {
	const rt = RuntimeContainerd
	cctx, cancel := context.WithTimeout(ctx, e.opts.APITimeout)
	raw, release, err := client.Version(cctx)
	cancel()
	if err != nil {
		e.add(rt, "version", Unread, "%s: %v", socket, err)
		if v, berr := bootstrap.BinaryVersion(e.h.Executable(target.PID), "containerd"); berr == nil {
			rep.Version = v.String()
			e.add(rt, "version", Info, "containerd %s (build information of pid %d; its API does not answer)", v, target.PID)
		}
		rep.State, rep.Reason = Unknown, fmt.Sprintf("containerd's API at %s does not answer (unreachable or permission denied: a pod needs the host's socket and root): %v", socket, err)
		return "", release, false
	}
	rep.Version = raw
	e.add(rt, "version", Info, "containerd %s on %s (version service)", raw, socket)
	return raw, release, true
}

// criPlugin is the CRI plugin step: it must have loaded, otherwise the kubelet pulls nothing
// through this daemon.
func (e *evaluator) criPlugin(ctx context.Context, rep *RuntimeReport, client *containerdClient, eff *bcontainerd.Effective) bool {
	const rt = RuntimeContainerd
	cctx, cancel := context.WithTimeout(ctx, e.opts.APITimeout)
	failed, err := client.CRIPluginFailures(cctx)
	cancel()
	switch {
	case err != nil:
		e.add(rt, "cri-plugin", Unread, "%v", err)
		rep.State, rep.Reason = Unknown, "cannot list containerd's plugins: "+err.Error()
		return false
	case len(failed) > 0:
		e.add(rt, "cri-plugin", Fail, "%s", strings.Join(failed, "; "))
		rep.State, rep.Reason = NotActive, "containerd's CRI plugin failed to load: "+strings.Join(failed, "; ")
		problems := "see the containerd log"
		if len(eff.Problems) > 0 {
			problems = strings.Join(eff.Problems, "; ")
		}
		rep.Remedy = "fix the CRI configuration (" + problems + ") and " + remedyRestartContainerd
		return false
	}
	e.add(rt, "cri-plugin", Pass, "introspection lists the CRI plugins loaded")
	return true
}

// loadedConfigPath is the loaded-config step: the config_path the daemon says it runs with
// (introspection on >= 2.4, CRI status on 1.x); not known when it cannot say.
func (e *evaluator) loadedConfigPath(ctx context.Context, client *containerdClient, release bcontainerd.Release, raw string) loadedView {
	const rt = RuntimeContainerd
	switch {
	case release.IntrospectsConfigPath():
		cctx, cancel := context.WithTimeout(ctx, e.opts.APITimeout)
		p, err := client.RegistryConfigPath(cctx)
		cancel()
		if err != nil {
			e.add(rt, "loaded-config", Unread, "%v: judging by start time", err)
			return loadedView{}
		}
		e.add(rt, "loaded-config", Pass, "introspection (%s.%s) says the daemon runs with config_path %q", criImagesPluginType, criImagesPluginID, p)
		return loadedView{configPath: p, known: true, source: "introspection"}
	case release.CRIStatusConfig():
		cctx, cancel := context.WithTimeout(ctx, e.opts.APITimeout)
		p, ok, err := client.CRIConfigPath(cctx)
		cancel()
		if err != nil {
			e.add(rt, "loaded-config", Unread, "%v: judging by start time", err)
			return loadedView{}
		}
		if !ok {
			e.add(rt, "loaded-config", Unread, "CRI status (verbose) carries no registry section: judging by start time")
			return loadedView{}
		}
		e.add(rt, "loaded-config", Pass, "CRI status (verbose) says the daemon runs with registry.configPath %q", p)
		return loadedView{configPath: p, known: true, source: "cri-status"}
	default:
		e.add(rt, "loaded-config", Info, "containerd %s exports no registry configuration (only 1.x CRI status and >= 2.4 introspection do): judging by start time", raw)
		return loadedView{}
	}
}

// startTimeView is the start-time step, when the daemon cannot say what it loaded (2.0–2.3, or
// no answer): its start against the newest change of the configuration. Not ok: the report is
// NotActive and pending.
func (e *evaluator) startTimeView(ctx context.Context, rep *RuntimeReport, restart *RestartEvidence, onDisk string) (loadedView, bool) {
	const rt = RuntimeContainerd
	switch {
	case restart == nil:
		e.add(rt, "start-time", Pass, "no config file: the daemon runs with the built-in default")
		return loadedView{configPath: onDisk, known: true, source: "start-time"}, true
	case restart.Order == Loaded:
		e.add(rt, "start-time", Pass, "%s: it loaded the files on disk", restart.Reason("containerd"))
		return loadedView{configPath: onDisk, known: true, source: "start-time"}, true
	}
	why := restart.Reason("containerd")
	e.add(rt, "start-time", Fail, "%s: it has not loaded the files on disk", why)
	rep.State, rep.Reason, rep.Remedy = NotActive, why+": the running daemon has not loaded the current configuration", remedyRestartContainerd
	if restart.Order == Ambiguous {
		rep.Reason, rep.Remedy = ambiguousStart(restart, "containerd", "restart containerd", remedyRestartContainerd, "",
			e.mirrorHint(ctx, splitConfigPath(onDisk)))
	}
	rep.Pending, rep.startTimeOnly = true, true
	e.warn("containerd: the configuration changed after containerd started: pending until containerd restarts")
	return loadedView{}, false
}

// pendingChange is the pending step, when the daemon said what it loaded: a config_path on disk
// that differs, or any change since its start, waits for a restart.
func (e *evaluator) pendingChange(rep *RuntimeReport, restart *RestartEvidence, loaded, onDisk string) {
	const rt = RuntimeContainerd
	switch {
	case loaded != onDisk:
		rep.Pending = true
		e.add(rt, "pending", Warn, "config_path on disk is %q but the daemon runs with %q: pending until containerd restarts", onDisk, loaded)
		e.warn("containerd: config_path on disk (%q) differs from the loaded one (%q): pending until containerd restarts", onDisk, loaded)
	case restart.RestartRequired():
		rep.Pending = true
		e.add(rt, "pending", Warn, "%s: any change is pending until containerd restarts", restart.Reason("containerd"))
		e.warn("containerd: %s changed after containerd started: pending until containerd restarts", restart.File)
	}
}

// configPathUse is the config_path step: how the daemon uses the loaded config_path (one
// directory, or a list that only local pull splits). It returns the directories to look in;
// not ok: the report is NotActive.
func (e *evaluator) configPathUse(rep *RuntimeReport, eff *bcontainerd.Effective, loaded, onDisk string) ([]string, bool) {
	const rt = RuntimeContainerd
	if loaded == "" {
		e.add(rt, "config_path", Fail, "no config_path: containerd %s does not read hosts.toml files", rep.Version)
		rep.State, rep.Reason = NotActive, "the running containerd has no registry config_path"
		rep.Remedy = fixThenRestart(*rep, onDisk, "run nodecache gen containerd")
		return nil, false
	}
	roots := splitConfigPath(loaded)
	transfer := eff.TransferService
	if len(roots) > 1 {
		if transfer {
			e.add(rt, "config_path", Fail, "%q is a list; containerd >= 2.1 pulls through the transfer service, which reads it as ONE directory, so every hosts.toml is ignored (containerd #12415, #12808)", loaded)
			rep.State, rep.Reason = NotActive, fmt.Sprintf("config_path %q is a list, which the transfer service ignores", loaded)
			rep.Remedy = fixThenRestart(*rep, onDisk, "set config_path to a single directory (nodecache gen containerd)")
			return nil, false
		}
		why := "containerd 1.x and 2.0 split it"
		if len(eff.LocalPull) > 0 {
			why = "local pull is forced (" + strings.Join(eff.LocalPull, ", ") + ")"
		}
		e.add(rt, "config_path", Pass, "%q is a list, read in order: %s", loaded, why)
	} else {
		mode := "transfer service"
		if !transfer {
			mode = "local pull"
			if len(eff.LocalPull) > 0 {
				mode += " (" + strings.Join(eff.LocalPull, ", ") + ")"
			}
		}
		e.add(rt, "config_path", Pass, "one directory %s (%s)", loaded, mode)
	}
	if !eff.Daemon.V2() {
		if legacy := legacyTables(eff.Registry); len(legacy) > 0 {
			e.warn("containerd: legacy registry.%s set next to config_path", strings.Join(legacy, "/"))
		}
	}
	return roots, true
}

// judgeHosts runs the hosts.toml check under roots and sets the runtime's state. The registries
// judged are Options.Upstreams, else every registry whose hosts.toml nodecache wrote or adopted
// or names the mirror (judgedRegistries): the verdict follows what containerd's parser does with
// the files, not who wrote them.
func (e *evaluator) judgeHosts(ctx context.Context, rep RuntimeReport, rt string, roots []string) RuntimeReport {
	var lead hostsLead
	if rt == RuntimeTalos {
		lead = talosLead(mirrorsOf(e.opts.Mirror, nil))
	}
	files, err := scanHosts(ctx, e.h, roots, lead)
	if err != nil {
		e.add(rt, "hosts", Unread, "%v", err)
		rep.State, rep.Reason = Unknown, err.Error()
		return rep
	}
	mirrors := mirrorsOf(e.opts.Mirror, files)
	ups := e.opts.Upstreams
	if len(ups) == 0 {
		var skipped []hostsFile
		ups, skipped = judgedRegistries(files, mirrors)
		for _, f := range skipped {
			if mirrors.known() {
				e.add(rt, "hosts "+f.Registry, Info, "%s: not judged, it does not name the mirror %s (status --upstream %s judges it)", f.summary(), mirrors, f.Registry)
			}
		}
	}
	if len(ups) == 0 {
		return e.noMirrorHosts(rep, rt, roots, files, mirrors)
	}
	rep.upstreams = ups
	verdicts := checkHosts(ctx, e.h, roots, ups, mirrors, lead)
	bad, undecided := e.addHostsVerdicts(&rep, rt, verdicts)
	switch {
	case len(bad) > 0:
		rep.State = NotActive
		verb := "do"
		if len(bad) == 1 {
			verb = "does"
		}
		rep.Reason = fmt.Sprintf("%d of %s %s not go through the mirror (%s): %s", len(bad), clitext.Count(len(verdicts), "registry"), verb, upstreamNames(bad), bad[0].Reason)
		if len(bad) > 1 {
			rep.Reason += "; …"
		}
		rep.Remedy = remedyHosts(rt)
		return rep
	case len(undecided) > 0:
		rep.State = Unknown
		rep.Reason = fmt.Sprintf("cannot tell whether %s pull through the mirror: %s", upstreamNames(undecided), undecided[0].Reason)
		rep.Remedy = "pass --mirror URL (the mirror the runtime is pointed at)"
		return rep
	}
	rep.State = Active
	rep.Reason = activeHostsReason(rep, ups)
	if rep.Pending {
		rep.Remedy = "a configuration change is pending: " + remedyRestartContainerd
	}
	return rep
}

// addHostsVerdicts records each registry's verdict and returns those that do not go through
// the mirror and those it cannot tell; rep.Mirror becomes the first good mirror.
func (e *evaluator) addHostsVerdicts(rep *RuntimeReport, rt string, verdicts []hostsVerdict) (bad, undecided []hostsVerdict) {
	for _, v := range verdicts {
		switch {
		case v.OK:
			e.add(rt, "hosts "+v.Upstream, Pass, "%s", v.Reason)
			if rep.Mirror == "" {
				rep.Mirror = v.First
			}
		case v.Undecided:
			e.add(rt, "hosts "+v.Upstream, Unread, "%s", v.Reason)
			undecided = append(undecided, v)
		default:
			e.add(rt, "hosts "+v.Upstream, Fail, "%s", v.Reason)
			bad = append(bad, v)
		}
	}
	return bad, undecided
}

// activeHostsReason is the reason of an Active verdict, by the evidence that the daemon loaded
// its config_path.
func activeHostsReason(rep RuntimeReport, ups []string) string {
	first := fmt.Sprintf("containerd's hosts.toml parser puts the mirror first for %s", strings.Join(ups, ", "))
	switch rep.Evidence {
	case "introspection":
		return "the running containerd loaded config_path " + *rep.LoadedConfigPath + " (introspection) and " + first
	case "cri-status":
		return "the running containerd loaded config_path " + *rep.LoadedConfigPath + " (CRI status) and " + first
	case "start-time":
		return "containerd started after its configuration last changed, config_path " + *rep.LoadedConfigPath + ", and " + first
	default:
		return first
	}
}

// noMirrorHosts is the verdict when no hosts.toml under roots is nodecache's or names the
// mirror: NotActive when there is none, when the mirror is known and none names it, or when
// every file sends containerd to the registry itself; Unknown when files put other hosts first
// and nothing tells which host the mirror is. The reason names the files.
func (e *evaluator) noMirrorHosts(rep RuntimeReport, rt string, roots []string, files []hostsFile, mirrors mirrorSet) RuntimeReport {
	where := strings.Join(roots, ", ")
	var seen []string
	direct := true
	for _, f := range files {
		seen = append(seen, f.summary())
		if f.Err == nil && len(f.Hosts) > 0 && !ownEndpoint(f.Hosts[0], f.Registry) {
			direct = false
		}
	}
	listed := ""
	if len(seen) > 0 {
		if len(seen) > 3 {
			seen = append(seen[:3], fmt.Sprintf("and %d more", len(seen)-3))
		}
		listed = " (" + strings.Join(seen, "; ") + ")"
	}
	rep.State, rep.Remedy = NotActive, remedyHosts(rt)
	switch {
	case len(files) == 0 && rt == RuntimeTalos:
		rep.Reason = "no registry mirror configured (no hosts.toml under " + where + ")"
	case len(files) == 0:
		rep.Reason = "no hosts.toml under " + where + ": containerd pulls from every registry directly"
		rep.Remedy = "run nodecache gen containerd (the agent does this at start)"
	case mirrors.known():
		rep.Reason = fmt.Sprintf("no hosts.toml under %s names the mirror %s%s", where, mirrors, listed)
	case direct:
		rep.Reason = fmt.Sprintf("no hosts.toml under %s puts a mirror first%s", where, listed)
	default:
		rep.State = Unknown
		rep.Reason = fmt.Sprintf("cannot tell which host is the mirror: no --mirror was given and no hosts.toml under %s was written by nodecache%s", where, listed)
		rep.Remedy = "pass --mirror URL (the mirror the runtime is pointed at)"
		e.add(rt, "hosts", Unread, "%s", rep.Reason)
		return rep
	}
	e.add(rt, "hosts", Fail, "%s", rep.Reason)
	return rep
}

// remedyHosts is the remedy for hosts.toml files that do not put the mirror first.
func remedyHosts(rt string) string {
	if rt == RuntimeTalos {
		return "apply the machine-config patch from nodecache gen talos"
	}
	return "run nodecache gen containerd (hosts.toml files are re-read on every pull; no restart needed for them)"
}

func upstreamNames(vs []hostsVerdict) string {
	names := make([]string, 0, len(vs))
	for _, v := range vs {
		names = append(names, v.Upstream)
	}
	return strings.Join(names, ", ")
}

// onDiskRegistries lists the registries judgeHosts would judge under the on-disk config_path
// (best effort: unreadable directories give none).
func (e *evaluator) onDiskRegistries(ctx context.Context, configPath string) []string {
	if configPath == "" {
		return nil
	}
	files, err := scanHosts(ctx, e.h, splitConfigPath(configPath), nil)
	if err != nil {
		return nil
	}
	found, _ := judgedRegistries(files, mirrorsOf(e.opts.Mirror, files))
	return found
}

// fixThenRestart is the remedy when the loaded config_path is wrong: when the on-disk one is
// already a single directory and only waits for a restart (the agent's gen pass ran), only the
// restart is asked for; otherwise fix first, then restart.
func fixThenRestart(rep RuntimeReport, onDisk, fix string) string {
	if rep.Pending && onDisk != "" && len(splitConfigPath(onDisk)) == 1 {
		return "config_path on disk is already " + onDisk + ": " + remedyRestartContainerd
	}
	return fix + ", then " + remedyRestartContainerd
}

// legacyTables names the deprecated registry tables set in the effective configuration.
func legacyTables(r bcontainerd.Registry) []string {
	var out []string
	if len(r.Mirrors) > 0 {
		out = append(out, "mirrors")
	}
	if len(r.ConfigsTLS) > 0 || len(r.ConfigsAuth) > 0 {
		out = append(out, "configs")
	}
	if r.Auths > 0 {
		out = append(out, "auths")
	}
	return out
}

// splitConfigPath splits a config_path the way local pull does (":"-separated list).
func splitConfigPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, ":") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// configError is the verdict for a configuration that cannot be read: one containerd refuses
// (does not parse, a missing import) is NOT ACTIVE — containerd would not start with it — and
// one that cannot be read at all (permission; a directory, FIFO or device, or a file over
// inputfile.RuntimeConfig.Limit, which nodecache does not read) is UNKNOWN.
func (e *evaluator) configError(rep RuntimeReport, err error) RuntimeReport {
	if errors.Is(err, refusal.ErrRefused) && !inputfile.Refused(err) {
		e.add(rep.Runtime, "config", Fail, "%v", err)
		rep.State, rep.Reason = NotActive, "containerd refuses its configuration: "+err.Error()
		rep.Remedy = "fix the file named, then " + remedyRestartContainerd
		return rep
	}
	e.add(rep.Runtime, "config", Unread, "%v", err)
	rep.State, rep.Reason = Unknown, "cannot read the containerd configuration: "+err.Error()
	return rep
}
