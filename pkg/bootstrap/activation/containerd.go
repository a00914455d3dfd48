package activation

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// remedyRestartContainerd is the remedy when containerd has not loaded a correct config_path:
// config_path is read only at daemon start, containerd has no reload, and nodecache never
// restarts or signals it (DESIGN.md, Contracts: safety).
const remedyRestartContainerd = "restart containerd or cycle the node (nodecache never restarts containerd)"

// containerdTarget is the daemon examined and how it was picked.
type containerdTarget struct {
	proc   Process
	socket string
	how    string
}

// pickContainerd finds the containerd process serving socket among procs.
func (e *evaluator) pickContainerd(procs []Process, socket string) (containerdTarget, error) {
	var (
		matches []containerdTarget
		noFD    []Process
	)
	for _, p := range procs {
		ok, inode, err := e.proc.ListensOn(p.PID, socket)
		switch {
		case errors.Is(err, ErrNoFDAccess):
			noFD = append(noFD, p)
		case err != nil:
			return containerdTarget{}, err
		case ok:
			matches = append(matches, containerdTarget{proc: p, socket: socket,
				how: fmt.Sprintf("holds the listening socket %s (inode %d)", socket, inode)})
		}
	}
	// Fallback for processes whose descriptors may not be read: the address they were told.
	for _, p := range noFD {
		args, err := e.proc.Cmdline(p.PID)
		if err != nil {
			return containerdTarget{}, err
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
			if eff, err := bcontainerd.LoadEffective(e.opts.HostRoot, cfgPath); err == nil && eff.GRPCAddress != bcontainerd.DefaultSocket {
				addr, how = eff.GRPCAddress, "the grpc address in "+cfgPath
			}
		}
		if addr == socket {
			matches = append(matches, containerdTarget{proc: p, socket: socket,
				how: how + " (descriptors not readable, so the socket owner could not be checked)"})
		}
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		var pids []string
		for _, p := range procs {
			pids = append(pids, itoa(p.PID))
		}
		return containerdTarget{}, fmt.Errorf("none of the containerd processes (pid %s) serves %s; pass --containerd-socket", strings.Join(pids, ", "), socket)
	default:
		return containerdTarget{}, fmt.Errorf("%d containerd processes claim %s", len(matches), socket)
	}
}

// loadedView is the registry configuration a containerd daemon runs with.
type loadedView struct {
	configPath string
	known      bool
	source     string // introspection, cri-status, start-time
}

// containerd examines the containerd that serves ContainerdSocket.
func (e *evaluator) containerd(ctx context.Context) RuntimeReport {
	const rt = RuntimeContainerd
	rep := RuntimeReport{Runtime: rt}
	unknown := func(reason string) RuntimeReport {
		rep.State, rep.Reason = Unknown, reason
		return rep
	}
	socket := e.opts.ContainerdSocket
	if socket == "" {
		socket = bcontainerd.DefaultSocket
	}

	procs, err := e.proc.FindByComm("containerd")
	if err != nil {
		e.add(rt, "process", Unread, "%v", err)
		return unknown("cannot read the containerd process: " + err.Error())
	}
	var target *containerdTarget
	if len(procs) > 0 {
		t, err := e.pickContainerd(procs, socket)
		if err != nil {
			e.add(rt, "process", Unread, "%v", err)
			return unknown(err.Error())
		}
		target = &t
	}

	cfgPath := e.opts.ContainerdConfig
	cfgFrom := "--containerd-config"
	if cfgPath == "" && target != nil {
		if args, err := e.proc.Cmdline(target.proc.PID); err == nil {
			if c, ok := flagValue(args, "config", "c"); ok {
				cfgPath, cfgFrom = c, "the daemon's --config"
			}
		}
	}
	if cfgPath == "" {
		cfgPath, cfgFrom = bcontainerd.DefaultConfig, "default"
	}
	// The files first with the newest 2.x rules (which files, their mtimes); read again below
	// with the rules of the release that answers on the socket.
	eff, cfgErr := bcontainerd.LoadEffective(e.opts.HostRoot, cfgPath)
	cfgMissing := cfgErr == nil && !eff.Exists

	if target == nil {
		if cfgMissing {
			rep.State, rep.Reason = NotApplicable, fmt.Sprintf("no containerd process and no %s", cfgPath)
			if r := e.explicitNone(rt, "containerd", fmt.Sprintf("no process named containerd under %s and no %s", e.opts.ProcRoot, cfgPath)); r != "" {
				rep.Reason = r
			}
			e.add(rt, "process", Skipped, "no process named containerd; no config at %s", cfgPath)
			return rep
		}
		e.add(rt, "process", Unread, "no process named containerd under %s (a pod needs hostPID), but %s exists", e.opts.ProcRoot, cfgPath)
		return unknown("containerd configuration present but no containerd process is visible")
	}
	rep.PID = target.proc.PID
	start := target.proc.Start
	rep.ProcessStart = &start
	e.add(rt, "process", Pass, "pid %d %s; started %s", target.proc.PID, target.how, fmtTime(start))

	if cfgErr != nil {
		e.add(rt, "config", Unread, "%v", cfgErr)
		return unknown("cannot read the containerd configuration: " + cfgErr.Error())
	}
	newest := eff.Newest()
	if eff.Exists {
		var names []string
		for _, f := range eff.Files {
			names = append(names, f.Path)
		}
		e.add(rt, "config", Info, "%s (%s), schema version %d, newest change %s at %s", strings.Join(names, " + "), cfgFrom, eff.Schema, newest.Path, fmtTime(newest.ModTime))
	} else {
		e.add(rt, "config", Info, "%s (%s) does not exist: containerd runs on built-in defaults", cfgPath, cfgFrom)
	}
	changedSinceStart := len(eff.Files) > 0 && !startedAfter(start, newest.ModTime)

	// What the daemon says.
	var (
		ver    daemonVersion
		verErr error
		view   loadedView
	)
	client, err := dialContainerd(e.host(socket))
	if err == nil {
		defer client.Close()
		cctx, cancel := context.WithTimeout(ctx, e.opts.APITimeout)
		ver, verErr = client.Version(cctx)
		cancel()
	} else {
		verErr = err
	}
	if verErr != nil {
		e.add(rt, "version", Unread, "%s: %v", socket, verErr)
	} else {
		rep.Version = ver.Raw
		e.add(rt, "version", Info, "containerd %s on %s", ver.Raw, socket)
	}
	// The effective configuration as this release reads it: its own rules when it answered; else
	// 1.x rules for a schema <= 2 main file and the newest 2.x rules otherwise.
	rules := bootstrap.Version{}
	switch {
	case verErr == nil:
		rules = bootstrap.Version{Major: ver.Major, Minor: ver.Minor}
	case eff.Exists && eff.Schema <= 2:
		rules = bootstrap.Version{Major: 1, Minor: 7}
	}
	if !rules.IsZero() {
		if eff, err = bcontainerd.LoadEffective(e.opts.HostRoot, cfgPath, bcontainerd.LoadOptions{Daemon: rules}); err != nil {
			e.add(rt, "config", Unread, "%v", err)
			return unknown("cannot read the containerd configuration: " + err.Error())
		}
	}
	switch {
	case verErr != nil:
	case ver.atLeast(2, 4):
		cctx, cancel := context.WithTimeout(ctx, e.opts.APITimeout)
		p, err := client.RegistryConfigPath(cctx)
		cancel()
		if err != nil {
			e.add(rt, "loaded-config", Unread, "%v", err)
			if strings.Contains(err.Error(), "failed to load") {
				rep.State, rep.Reason = NotActive, err.Error()
				problems := "see the containerd log"
				if len(eff.Problems) > 0 {
					problems = strings.Join(eff.Problems, "; ")
				}
				rep.Remedy = "fix the CRI image configuration (" + problems + ") and " + remedyRestartContainerd
				return rep
			}
			break
		}
		view = loadedView{configPath: p, known: true, source: "introspection"}
		e.add(rt, "loaded-config", Pass, "introspection (%s.%s) says the daemon runs with config_path %q", criImagesPluginType, criImagesPluginID, p)
	case ver.Major == 1:
		cctx, cancel := context.WithTimeout(ctx, e.opts.APITimeout)
		p, ok, err := client.CRIConfigPath(cctx)
		cancel()
		if err != nil {
			e.add(rt, "loaded-config", Unread, "%v", err)
			break
		}
		if !ok {
			e.add(rt, "loaded-config", Unread, "CRI status (verbose) carries no registry section")
			break
		}
		view = loadedView{configPath: p, known: true, source: "cri-status"}
		e.add(rt, "loaded-config", Pass, "CRI status (verbose) says the daemon runs with registry.configPath %q", p)
	default:
		e.add(rt, "loaded-config", Info, "containerd %s exports no registry configuration (only 1.x CRI status and >= 2.4 introspection do): judging by start time", ver.Raw)
	}

	v2 := eff.Daemon.Major >= 2
	onDisk := eff.ConfigPath
	// The registries the on-disk files route through the mirror: what a canary pulls under
	// when the verdict is decided before the hosts check (a daemon that has not loaded them
	// yet is exactly where the canary's answer matters).
	rep.upstreams = e.upstreamsOr(e.onDiskRegistries(onDisk))

	if !view.known {
		// Start time against the newest change of the configuration (2.0–2.3, or no answer).
		switch {
		case len(eff.Files) == 0:
			view = loadedView{configPath: onDisk, known: true, source: "start-time"}
			e.add(rt, "start-time", Pass, "no config file: the daemon runs with the built-in default")
		case !changedSinceStart:
			view = loadedView{configPath: onDisk, known: true, source: "start-time"}
			e.add(rt, "start-time", Pass, "containerd started %s, after the last change of %s (%s): it loaded the files on disk", fmtTime(start), newest.Path, fmtTime(newest.ModTime))
		default:
			why := fmt.Sprintf("containerd started %s, not after the last change of %s (%s; equal seconds count as before)", fmtTime(start), newest.Path, fmtTime(newest.ModTime))
			e.add(rt, "start-time", Fail, "%s: it has not loaded the files on disk", why)
			if verErr != nil {
				return unknown("the daemon did not answer on " + socket + " and " + why)
			}
			rep.State, rep.Reason, rep.Remedy = NotActive, why+": the running daemon has not loaded the current configuration", remedyRestartContainerd
			if start.Unix() == newest.ModTime.Unix() {
				rep.Reason, rep.Remedy = sameSecond("containerd", "restart containerd", remedyRestartContainerd, start, newest.Path, "",
					e.mirrorHint(ctx, splitConfigPath(onDisk), rep.upstreams))
			}
			rep.Pending, rep.startTimeOnly = true, true
			e.warn("containerd: the configuration changed after containerd started: pending until containerd restarts")
			return rep
		}
	}
	rep.Evidence = view.source
	loaded := view.configPath
	rep.LoadedConfigPath = &loaded
	if view.source != "start-time" {
		switch {
		case loaded != onDisk:
			rep.Pending = true
			e.add(rt, "pending", Warn, "config_path on disk is %q but the daemon runs with %q: pending until containerd restarts", onDisk, loaded)
			e.warn("containerd: config_path on disk (%q) differs from the loaded one (%q): pending until containerd restarts", onDisk, loaded)
		case changedSinceStart:
			rep.Pending = true
			e.add(rt, "pending", Warn, "%s changed at %s, after containerd started (%s): any change is pending until containerd restarts", newest.Path, fmtTime(newest.ModTime), fmtTime(start))
			e.warn("containerd: %s changed after containerd started: pending until containerd restarts", newest.Path)
		}
	}

	// How the daemon uses that config_path.
	if loaded == "" {
		e.add(rt, "config_path", Fail, "no config_path: containerd %s does not read hosts.toml files", rep.Version)
		rep.State, rep.Reason = NotActive, "the running containerd has no registry config_path"
		rep.Remedy = fixThenRestart(rep, onDisk, "run nodecache gen containerd")
		return rep
	}
	roots := splitConfigPath(loaded)
	transfer := eff.TransferService
	if len(roots) > 1 {
		if transfer {
			e.add(rt, "config_path", Fail, "%q is a list; containerd >= 2.1 pulls through the transfer service, which reads it as ONE directory, so every hosts.toml is ignored (containerd #12415, #12808)", loaded)
			rep.State, rep.Reason = NotActive, fmt.Sprintf("config_path %q is a list, which the transfer service ignores", loaded)
			rep.Remedy = fixThenRestart(rep, onDisk, "set config_path to a single directory (nodecache gen containerd)")
			return rep
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
	if !v2 {
		if legacy := legacyTables(eff.Registry); len(legacy) > 0 {
			e.warn("containerd: legacy registry.%s set next to config_path", strings.Join(legacy, "/"))
		}
	}

	return e.judgeHosts(ctx, rep, rt, roots, true)
}

// judgeHosts runs the hosts.toml check under roots and sets the runtime's state.
func (e *evaluator) judgeHosts(ctx context.Context, rep RuntimeReport, rt string, roots []string, onlyManaged bool) RuntimeReport {
	ups := e.opts.Upstreams
	if len(ups) == 0 {
		found, err := registryDirs(e.opts.HostRoot, roots, onlyManaged)
		if err != nil {
			e.add(rt, "hosts", Unread, "%v", err)
			rep.State, rep.Reason = Unknown, err.Error()
			return rep
		}
		ups = found
	}
	if len(ups) == 0 {
		what := "no hosts.toml written by nodecache"
		if !onlyManaged {
			what = "no registry mirror configured (no hosts.toml)"
		}
		e.add(rt, "hosts", Fail, "%s under %s", what, strings.Join(roots, ", "))
		rep.State, rep.Reason = NotActive, what+" under "+strings.Join(roots, ", ")
		if rt == RuntimeTalos {
			rep.Remedy = "apply the machine-config patch from nodecache gen talos"
		} else {
			rep.Remedy = "run nodecache gen containerd (the agent does this at start)"
		}
		return rep
	}
	rep.upstreams = ups
	verdicts := checkHosts(ctx, e.opts.HostRoot, roots, ups, e.opts.Mirror)
	var bad []string
	for _, v := range verdicts {
		if v.OK {
			e.add(rt, "hosts "+v.Upstream, Pass, "%s", v.Reason)
			if rep.Mirror == "" {
				rep.Mirror = v.First
			}
		} else {
			e.add(rt, "hosts "+v.Upstream, Fail, "%s", v.Reason)
			bad = append(bad, v.Upstream)
		}
	}
	if len(bad) > 0 {
		rep.State = NotActive
		rep.Reason = fmt.Sprintf("%d of %d registries do not go through the mirror (%s)", len(bad), len(verdicts), strings.Join(bad, ", "))
		if rt == RuntimeTalos {
			rep.Remedy = "apply the machine-config patch from nodecache gen talos"
		} else {
			rep.Remedy = "run nodecache gen containerd (hosts.toml files are re-read on every pull; no restart needed for them)"
		}
		return rep
	}
	rep.State = Active
	switch rep.Evidence {
	case "introspection":
		rep.Reason = "the running containerd loaded config_path " + *rep.LoadedConfigPath + " (introspection) and every hosts.toml puts the mirror first"
	case "cri-status":
		rep.Reason = "the running containerd loaded config_path " + *rep.LoadedConfigPath + " (CRI status) and every hosts.toml puts the mirror first"
	case "start-time":
		rep.Reason = "containerd started after its configuration last changed, config_path " + *rep.LoadedConfigPath + ", and every hosts.toml puts the mirror first"
	default:
		rep.Reason = "every hosts.toml puts the mirror first"
	}
	if rep.Pending {
		rep.Remedy = "a configuration change is pending: " + remedyRestartContainerd
	}
	return rep
}

// onDiskRegistries lists the registries with a nodecache-written hosts.toml under the on-disk
// config_path (best effort: unreadable directories give none).
func (e *evaluator) onDiskRegistries(configPath string) []string {
	if configPath == "" {
		return nil
	}
	found, err := registryDirs(e.opts.HostRoot, splitConfigPath(configPath), true)
	if err != nil {
		return nil
	}
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
