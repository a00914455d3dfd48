package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
	"github.com/nodecache/nodecache/pkg/name"
)

func genCommand() *cli.Command {
	return &cli.Command{
		Name:  "gen",
		Usage: "point a node's runtime at the mirror: Talos patch, containerd hosts.toml, CRI-O drop-in",
		Description: `Exit codes: 0 generated (or nothing to change); 1 writing failed; 2 a flag or a runtime
config file refused, nothing was changed. restart_required is reported, never acted on:
nodecache never restarts or signals containerd.`,
		Subcommands: []*cli.Command{genTalosCommand(), genContainerdCommand(), genCrioCommand()},
	}
}

// genCommonFlags are shared by every gen subcommand.
func genCommonFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag("mirror", "", "nodecache `URL` the runtime pulls through, e.g. http://10.0.0.5:5000 (http://127.0.0.1:5000 for a hostNetwork agent); required"),
		stringSliceFlag("upstream", nil, "registry `NAME[=URL]` to pull through the mirror, repeatable (default: serve's set: docker.io, ghcr.io, registry.k8s.io, quay.io, gcr.io). The fallback after the mirror is the registry itself: https://NAME (docker.io: https://registry-1.docker.io), or URL when its host is NAME, e.g. registry.local:5000=http://registry.local:5000 for an http-only registry; a URL naming another host is refused"),
		stringFlag("mirror-ca", "", "PEM CA `FILE` of an https mirror (refused for http); gen containerd and crio: a host path, read under --host-root; gen talos: a file on this machine"),
		stringFlag("output", "text", "report format: text or json"),
		boolFlag("dry-run", "print what would change as a unified diff; write nothing"),
		boolFlag("remove", "undo: remove nodecache's files and restore edited ones from their backups"),
	}
}

func hostRootFlag() cli.Flag {
	return stringFlag("host-root", "/", "`DIR` prefixed to every host path (a pod with the host's / mounted there)")
}

// genBase holds the flags every subcommand reads.
type genBase struct {
	mirror    name.Mirror
	upstreams []string
	fallbacks map[string]string
	output    string
	dryRun    bool
	remove    bool
	// host is the one view of the node every read, write, link and process lookup goes through.
	host *bootstrap.Host
}

func readGenBase(c *cli.Context, needMirror bool) (genBase, error) {
	var b genBase
	var err error
	if b.output, err = outputFormat(c); err != nil {
		return b, err
	}
	b.dryRun, b.remove = c.Bool("dry-run"), c.Bool("remove")
	if needMirror || c.String("mirror") != "" {
		if b.mirror, err = name.ParseMirror(c.String("mirror")); err != nil {
			return b, withCode(exitUsage, err)
		}
	}
	if b.upstreams, err = bootstrap.UpstreamNames(c.StringSlice("upstream")); err != nil {
		return b, withCode(exitUsage, err)
	}
	if b.fallbacks, err = bootstrap.Fallbacks(c.StringSlice("upstream")); err != nil {
		return b, withCode(exitUsage, err)
	}
	if c.Args().Len() > 0 {
		return b, usagef("unexpected argument %q: gen takes flags only", c.Args().First())
	}
	root := "/"
	if c.IsSet("host-root") || c.String("host-root") != "" {
		root = c.String("host-root")
	}
	if b.host, err = bootstrap.NewHost(bootstrap.HostOptions{Root: root}); err != nil {
		return b, usagef("%v", err)
	}
	return b, nil
}

// genError maps a package error to the exit code: refused input is 2, anything else 1.
func genError(err error) error {
	if errors.Is(err, bootstrap.ErrRefused) {
		return withCode(exitUsage, err)
	}
	return withCode(exitNegative, err)
}

// ---- talos

func genTalosCommand() *cli.Command {
	flags := append(genCommonFlags(),
		stringFlag("talos-version", talos.DefaultVersion(), "target Talos `vX.Y.Z`: >= v1.12 gets RegistryMirrorConfig documents, <= v1.11 the machine.registries patch"),
		boolFlag("skip-fallback", "never fall back to the real registry (Talos >= v1.9; refused with a loopback mirror)"),
		boolFlag("path-prefix", "endpoint <mirror>/v2/<NAME> with overridePath instead of ?ns= routing"),
		stringFlag("machine-config", "", "with --remove: the node's current machine config `FILE` (`talosctl read /system/state/config.yaml` or `talosctl get machineconfig -o yaml` output); the removal then deletes exactly the mirrors whose endpoints include --mirror"),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "out", Aliases: []string{"o"}, EnvVars: envVars("out"),
			Usage: "write the patch to `FILE` (replaced only when it is nodecache's) instead of printing it"}),
	)
	return withConfig(&cli.Command{
		Name:  "talos",
		Usage: "print (or -o write) the Talos machine-config patch",
		Description: `Use the patch with 'talosctl gen config --config-patch @patch.yaml' or
'talosctl patch machineconfig --patch @patch.yaml'; --remove prints the $patch: delete patch that
takes it out again: with --machine-config FILE (and --mirror) exactly the mirrors of that config
whose endpoints include the mirror; without it the --upstream list, which must be the list the
patch was made with (a name the node does not have makes the patch fail). Talos applies mirror
changes without a reboot.`,
		Flags:  append(flags, logFlags()...),
		Action: runGenTalos,
	})
}

func runGenTalos(c *cli.Context) error {
	b, err := readGenBase(c, !c.Bool("remove"))
	if err != nil {
		return err
	}
	if b.dryRun && c.String("out") == "" {
		return usagef("--dry-run needs -o FILE: without it gen talos only prints")
	}
	opts := talos.Options{Mirror: b.mirror, Upstreams: b.upstreams, Fallbacks: b.fallbacks, TalosVersion: c.String("talos-version"),
		SkipFallback: c.Bool("skip-fallback"), PathPrefix: c.Bool("path-prefix"), Remove: b.remove}
	if p := c.String("machine-config"); p != "" {
		if !b.remove {
			return usagef("--machine-config is for --remove: the node's config tells which mirrors to delete")
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return usagef("--machine-config: %v", err)
		}
		if opts.MachineConfig, err = talos.ParseMachineConfig(p, data); err != nil {
			return genError(err)
		}
	}
	if p := c.String("mirror-ca"); p != "" {
		// A file on this machine (the patch carries it), so a relative path is fine.
		abs, err := filepath.Abs(p)
		if err != nil {
			return usagef("--mirror-ca %q: %v", p, err)
		}
		ca, err := bootstrap.ReadMirrorCA(bootstrap.HostFS("/"), "", abs)
		if err != nil {
			return genError(err)
		}
		opts.MirrorCA, opts.MirrorCAName = ca, p
	}
	res, err := talos.Generate(opts)
	if err != nil {
		return genError(err)
	}
	printWarnings(c.App.ErrWriter, res.Warnings)
	out := c.String("out")
	var changes []bootstrap.Change
	if out != "" {
		fsys := bootstrap.HostFS("/")
		abs := out
		if !strings.HasPrefix(abs, "/") {
			wd, err := os.Getwd()
			if err != nil {
				return withCode(exitNegative, err)
			}
			abs = wd + "/" + out
		}
		if err := checkOutFile(fsys, out, abs); err != nil {
			return err
		}
		ch, err := bootstrap.PlanOwned(fsys, abs, 0o644, []byte(res.Patch))
		if err != nil {
			return genError(err)
		}
		// A link at -o stays; the file it leads to is written.
		if changes, err = bootstrap.ResolveChanges(fsys, []bootstrap.Change{ch}); err != nil {
			return genError(err)
		}
		if !b.dryRun {
			if err := (bootstrap.Applier{}).Apply(c.Context, changes); err != nil {
				return withCode(exitNegative, err)
			}
		}
	}
	if b.output == "json" {
		return writeJSON(c.App.Writer, struct {
			*talos.Result
			File    string             `json:"file,omitempty"`
			Changes []bootstrap.Change `json:"changes,omitempty"`
			DryRun  bool               `json:"dry_run,omitempty"`
		}{res, out, changes, b.dryRun})
	}
	if out == "" {
		_, err := io.WriteString(c.App.Writer, res.Patch)
		return err
	}
	if b.dryRun {
		d, err := bootstrap.Diff(changes)
		if err != nil {
			return withCode(exitNegative, err)
		}
		fmt.Fprint(c.App.Writer, d)
	}
	printChanges(c.App.Writer, changes, b.dryRun)
	fmt.Fprintf(c.App.Writer, "talos %s patch (%s form) for %s\n", res.TalosVersion, res.Form, strings.Join(res.Upstreams, ", "))
	return nil
}

// checkOutFile refuses (exit 2) an -o path that is a directory or whose directory does not
// exist: gen writes one file and creates no directories for it.
func checkOutFile(fsys fs.FS, out, abs string) error {
	real, err := bootstrap.Resolve(fsys, abs)
	if err != nil {
		return genError(err)
	}
	dir := path.Dir(real)
	switch fi, err := fs.Stat(fsys, bootstrap.FSName(dir)); {
	case errors.Is(err, fs.ErrNotExist):
		return usagef("-o %s: directory %s does not exist: create it first (gen writes the file only)", out, dir)
	case err != nil:
		return usagef("-o %s: directory %s: %v", out, dir, err)
	case !fi.IsDir():
		return usagef("-o %s: %s is not a directory", out, dir)
	}
	if fi, err := fs.Stat(fsys, bootstrap.FSName(real)); err == nil && fi.IsDir() {
		return usagef("-o %s: is a directory; want a file path, e.g. %s", out, path.Join(real, "nodecache-patch.yaml"))
	}
	return nil
}

// ---- containerd

func genContainerdCommand() *cli.Command {
	flags := append(genCommonFlags(), hostRootFlag(),
		stringFlag("containerd-config", containerd.DefaultConfig, "containerd's main config `PATH` (host path)"),
		stringFlag("certs-dir", containerd.DefaultCertsDir, "the single `DIR` written into config_path when it has to be set"),
		stringFlag("containerd-version", "", "containerd `VERSION` whose rules apply (default: asked of the running containerd, else read from its binary's build information; never run)"),
		boolFlag("migrate", "move legacy registry.mirrors (and 1.x configs.<host>.tls) into hosts.toml and remove them, instead of refusing"),
	)
	return withConfig(&cli.Command{
		Name:  "containerd",
		Usage: "write hosts.toml per upstream and, when needed, registry config_path in config.toml",
		Description: `Reads config.toml merged with its imports the way containerd does, adopts an existing
single-directory config_path (no restart), else sets one directory (--certs-dir) and reports
restart_required. Refuses (exit 2, nothing changed): schema 1, legacy mirrors next to config_path
(unless --migrate), k3s/RKE2 and Talos. config.toml is edited in place by byte range, backed up
once to <file>.nodecache.bak.`,
		Flags:  append(flags, logFlags()...),
		Action: runGenContainerd,
	})
}

func runGenContainerd(c *cli.Context) error {
	b, err := readGenBase(c, !c.Bool("remove"))
	if err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	opts := containerd.Options{Mirror: b.mirror, Upstreams: b.upstreams, Fallbacks: b.fallbacks, Config: c.String("containerd-config"),
		CertsDir: c.String("certs-dir"), MirrorCA: c.String("mirror-ca"), Migrate: c.Bool("migrate")}
	var versionNote string
	if v := c.String("containerd-version"); v != "" {
		if opts.Daemon, err = bootstrap.ParseVersion(v); err != nil {
			return usagef("--containerd-version: %v", err)
		}
	} else if dv, err := activation.RuntimeVersion(c.Context, b.host, activation.RuntimeContainerd, activation.ContainerdSocket(b.host, opts.Config)); err != nil {
		versionNote = fmt.Sprintf("containerd version unknown (%v); pass --containerd-version", err)
		log.Warn().Err(err).Msg("containerd version unknown")
	} else {
		opts.Daemon = dv.Version
		log.Debug().Str("version", dv.Raw).Str("from", dv.Source).Msg("containerd version")
	}
	fsys := b.host.FS()
	if opts.MirrorCA != "" && !b.remove && !b.mirror.HTTP() {
		// Read here for a message that names the file under --host-root; Plan checks it again.
		if _, err := bootstrap.ReadMirrorCA(fsys, b.host.Root(), opts.MirrorCA); err != nil {
			return genError(err)
		}
	}
	var rep *containerd.Report
	if b.remove {
		rep, err = containerd.PlanRemove(fsys, opts)
	} else {
		rep, err = containerd.Plan(fsys, opts)
	}
	if err != nil {
		return genError(err)
	}
	if versionNote != "" {
		rep.Warnings = append([]string{versionNote}, rep.Warnings...)
	}
	diff, err := applyOrDiff(c, b, log, rep.Changes)
	if err != nil {
		return err
	}
	var restartReason string
	if !b.remove && !rep.RestartRequired {
		var warn string
		restartReason, warn = containerdStartedBefore(b.host, rep.Config, opts.Daemon)
		if warn != "" {
			rep.Warnings = append(rep.Warnings, warn)
		}
		if restartReason != "" {
			rep.RestartRequired = true
		}
	}
	if b.output == "json" {
		return writeJSON(c.App.Writer, struct {
			*containerd.Report
			RestartReason string `json:"restart_reason,omitempty"`
			DryRun        bool   `json:"dry_run,omitempty"`
			Diff          string `json:"diff,omitempty"`
		}{rep, restartReason, b.dryRun, diff})
	}
	w := c.App.Writer
	fmt.Fprintf(w, "containerd config: %s (schema %d, containerd %s%s)\n", rep.Config, rep.Schema, rep.Daemon, assumed(rep.DaemonAssumed))
	if !b.remove {
		where := rep.EditedFile
		if where == "" {
			where = "unchanged"
		}
		fmt.Fprintf(w, "registry table: %s (edited file: %s)\n", rep.RegistryTable, where)
		fmt.Fprintf(w, "config_path: %s (%s); hosts.toml in %s; transfer service: %v\n", rep.ConfigPath, rep.ConfigPathAction, rep.HostsDir, rep.TransferService)
		for _, h := range rep.Migrated {
			fmt.Fprintf(w, "migrated legacy settings of %s into hosts.toml\n", h)
		}
	}
	printChanges(w, rep.Changes, b.dryRun)
	printWarnings(w, rep.Warnings)
	if restartReason != "" {
		fmt.Fprintf(w, "restart_required: true (%s)\n", restartReason)
	} else {
		fmt.Fprintf(w, "restart_required: %v\n", rep.RestartRequired)
	}
	if rep.RestartRequired && !b.dryRun {
		fmt.Fprintln(w, "containerd reads config_path only at start: restart containerd (or cycle the node); nodecache never restarts it")
	}
	return nil
}

// containerdStartedBefore checks a config nodecache did not change this run: containerd reads
// its configuration only at start, so when it changed after the running containerd started (the
// restart-evidence rule status uses too: activation.ContainerdRestart, the daemon serving the
// config's grpc address, the newest of config.toml and its imports, ±10 ms), that daemon does not
// use it yet. reason is "" when the daemon loaded it, or when no containerd is visible; warn says
// why the check could not be made.
func containerdStartedBefore(h *bootstrap.Host, config string, daemon bootstrap.Version) (reason, warn string) {
	eff, err := containerd.Load(h.FS(), config, containerd.LoadOptions{Daemon: daemon})
	if err != nil || !eff.Exists {
		return "", ""
	}
	ev, err := activation.ContainerdRestart(h, eff, eff.GRPCAddress)
	switch {
	case err != nil:
		return "", fmt.Sprintf("cannot tell whether the running containerd read %s: %v", eff.Path, err)
	case ev.RestartRequired():
		return ev.Reason("containerd"), ""
	}
	return "", ""
}

func assumed(b bool) string {
	if b {
		return ", assumed"
	}
	return ""
}

// ---- crio

func genCrioCommand() *cli.Command {
	flags := append(genCommonFlags(), hostRootFlag(),
		stringFlag("registries-dir", crio.DefaultRegistriesDir, "containers/image drop-in `DIR` (host path)"),
		stringFlag("crio-dir", crio.DefaultCrioDir, "CRI-O drop-in `DIR` (host path)"),
		stringFlag("crio-version", "", "CRI-O `VERSION` (default: asked of the running CRI-O, else read from its binary's build information; never run); >= 1.30 also gets auto_reload_registries"),
		boolFlag("no-reload", "do not send CRI-O the best-effort SIGHUP after writing"),
	)
	return withConfig(&cli.Command{
		Name:  "crio",
		Usage: "write the registries.conf.d drop-in (and crio.conf.d auto_reload for CRI-O >= 1.30)",
		Description: `Writes 90-nodecache.conf with one [[registry]] per upstream whose mirror is
<mirror host:port>/<NAME>. The main registries.conf is never edited. After a change, one
best-effort SIGHUP goes to the process named exactly crio (--no-reload to skip); it is logged,
never taken as proof that CRI-O uses the mirror.`,
		Flags:  append(flags, logFlags()...),
		Action: runGenCrio,
	})
}

func runGenCrio(c *cli.Context) error {
	b, err := readGenBase(c, !c.Bool("remove"))
	if err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	opts := crio.Options{Mirror: b.mirror, Upstreams: b.upstreams, Fallbacks: b.fallbacks, RegistriesDir: c.String("registries-dir"), CrioDir: c.String("crio-dir")}
	var versionNote string
	if v := c.String("crio-version"); v != "" {
		if opts.Version, err = bootstrap.ParseVersion(v); err != nil {
			return usagef("--crio-version: %v", err)
		}
	} else if dv, err := activation.RuntimeVersion(c.Context, b.host, activation.RuntimeCRIO, activation.DefaultCRIOSocket); err != nil {
		versionNote = fmt.Sprintf("CRI-O version unknown (%v)", err)
	} else {
		opts.Version = dv.Version
	}
	fsys := b.host.FS()
	if p := c.String("mirror-ca"); p != "" && !b.remove {
		if b.mirror.HTTP() {
			return usagef("--mirror-ca is for an https mirror; %s is http", b.mirror)
		}
		if opts.MirrorCA, err = bootstrap.ReadMirrorCA(fsys, b.host.Root(), p); err != nil {
			return genError(err)
		}
	}
	var rep *crio.Report
	if b.remove {
		rep, err = crio.PlanRemove(fsys, opts)
	} else {
		rep, err = crio.Plan(fsys, opts)
	}
	if err != nil {
		return genError(err)
	}
	if versionNote != "" {
		rep.Warnings = append([]string{versionNote}, rep.Warnings...)
	}
	diff, err := applyOrDiff(c, b, log, rep.Changes)
	if err != nil {
		return err
	}
	var reload crio.ReloadResult
	switch {
	case b.dryRun:
		reload.Skipped = "--dry-run"
	case c.Bool("no-reload"):
		reload.Skipped = "--no-reload"
	case !rep.Changed():
		reload.Skipped = "nothing changed"
	default:
		reload = crio.Reload(b.host, log)
	}
	rep.Reload = &reload
	if b.output == "json" {
		return writeJSON(c.App.Writer, struct {
			*crio.Report
			DryRun bool   `json:"dry_run,omitempty"`
			Diff   string `json:"diff,omitempty"`
		}{rep, b.dryRun, diff})
	}
	w := c.App.Writer
	if b.remove {
		fmt.Fprintf(w, "crio %s: removing nodecache's drop-ins and CA copies\n", rep.Version)
	} else {
		fmt.Fprintf(w, "crio %s: mirror %s for %s\n", rep.Version, b.mirror, strings.Join(rep.Upstreams, ", "))
	}
	printChanges(w, rep.Changes, b.dryRun)
	printWarnings(w, rep.Warnings)
	switch {
	case len(reload.PIDs) > 0:
		fmt.Fprintf(w, "sent SIGHUP to crio (pid %v) to reload registries; this is not proof that CRI-O uses the mirror\n", reload.PIDs)
	case reload.Error != "":
		fmt.Fprintf(w, "reload: %s\n", reload.Error)
	default:
		fmt.Fprintf(w, "no SIGHUP sent: %s\n", reload.Skipped)
	}
	fmt.Fprintf(w, "restart_required: %v\n", rep.RestartRequired)
	return nil
}

// ---- shared output

// applyOrDiff prints the unified diff (--dry-run; returned for JSON output) or applies the
// changes.
func applyOrDiff(c *cli.Context, b genBase, log zerolog.Logger, changes []bootstrap.Change) (string, error) {
	if b.dryRun {
		d, err := bootstrap.Diff(changes)
		if err != nil {
			return "", withCode(exitNegative, err)
		}
		if b.output == "text" {
			_, err = io.WriteString(c.App.Writer, d)
		}
		return d, err
	}
	if err := b.host.Applier(log).Apply(c.Context, changes); err != nil {
		return "", withCode(exitNegative, err)
	}
	return "", nil
}

func printChanges(w io.Writer, changes []bootstrap.Change, dryRun bool) {
	verb := ""
	if dryRun {
		verb = "would "
	}
	for _, ch := range changes {
		line := fmt.Sprintf("%s%s %s", verb, ch.Action, ch.Path)
		if ch.Via != "" {
			line += " (via symbolic link " + ch.Via + ")"
		}
		if ch.Action == bootstrap.ActionUpdate && ch.Backup != "" {
			line += " (backup " + ch.Backup + ")"
		}
		if ch.Action == bootstrap.ActionRestore {
			line += " (from " + ch.Backup + ")"
		}
		if ch.Note != "" {
			line += ": " + ch.Note
		}
		fmt.Fprintln(w, line)
	}
}

func printWarnings(w io.Writer, ws []string) {
	for _, s := range ws {
		fmt.Fprintf(w, "warning: %s\n", s)
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
