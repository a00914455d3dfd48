package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/warm"
)

func warmCommand() *cli.Command {
	var (
		cfg    warm.Config
		output string
		lc     logConfig
	)
	flags := []cli.Flag{
		stringFlag(&cfg.Mirror, "mirror", "", "the pull-through cache to fill, at `URL` http(s)://host[:port] (required unless --to); warm talks only to it"),
		stringFlag(&cfg.To, "to", "", "write the images into bundle `DIR` from their --upstream registries instead (no cache needed), for nodecache cache import, serve --seed or Talos: each blob checked as written, the images listed only once all are stored; DIR is created, or must be empty or a bundle of --format to add to"),
		stringFlag(&cfg.Format, "format", "oci", "with --to, the bundle's layout `FORMAT`: oci (an OCI image layout: skopeo oci:DIR:REF, crane, oras) or talos-flat (talosctl images cache-create --layout flat's tree, for Talos boot media and talosctl image cache-serve)"),
		stringSliceFlag(&cfg.Upstreams, "upstream", name.DefaultUpstreamValues(), "with --to, `NAME[=URL]` of a registry to fetch from, repeatable, as serve takes it (default: serve's set): NAME as written in image references, URL where its API is reached (a bare NAME: https://NAME; Docker Hub: https://registry-1.docker.io)"),
		stringSliceFlag(&cfg.UpstreamAuth, "upstream-auth", nil, "with --to, `NAME=FILE`: fetch from upstream NAME with the credentials for NAME in FILE, a docker config.json or Kubernetes .dockerconfigjson (auths, credHelpers, credsStore; helpers run from PATH), as serve takes it, repeatable; sent only to NAME and its token realm"),
		stringSliceFlag(&cfg.UpstreamCA, "upstream-ca", nil, "with --to, `NAME=FILE`: also trust the PEM CA certificates in FILE for upstream NAME (its token realm and redirects included), repeatable"),
		stringFlag(&cfg.Platform, "platform", "", "walk only this `os/arch[/variant]`, chosen by --platform-match; default: this machine's. With --to, all keeps every platform of an index"),
		stringFlag(&cfg.PlatformMatch, "platform-match", string(warm.PlatformMatchTransfer), "`RULE` choosing an index's manifest for --platform, as the node's runtime does: transfer (exact os/arch/variant: containerd >= 2.1, CRI-O) or only (containerd 1.7 and 2.0: platforms.Only with its fallbacks, e.g. amd64 -> 386, arm64 -> arm/v7)"),
		durationFlag(&cfg.Wait, "wait", warm.DefaultWait, "wait this `DURATION`, by wall clock, for the mirror to answer GET /v2/ (0: one probe)"),
		durationFlag(&cfg.Deadline, "deadline", warm.DefaultDeadline, "stop the whole run after this `DURATION`, mirror wait included (0: no deadline)"),
		intFlag(&cfg.Concurrency, "concurrency", warm.DefaultConcurrency, "`NUMBER` of blobs fetched at once"),
		durationFlag(&cfg.BlobTimeout, "blob-timeout", warm.DefaultBlobTimeout, "longest `DURATION` one attempt at one blob or manifest may take"),
		intFlag(&cfg.Retries, "retries", warm.DefaultRetries, "`NUMBER` of retries per request on 5xx, 429 (honouring Retry-After) and broken streams (0: none)"),
		stringFlag(&cfg.Routing, "routing", string(warm.RoutingNS), "how the mirror is told the upstream, a `MODE`: ns (?ns=<registry>, like containerd) or path (/v2/<registry>/<repo>, like CRI-O)"),
		boolFlag(&cfg.Talos, "talos", "warm the Talos worker join set (kubelet, kube-proxy, pause, flannel) of the Talos version this build knows"),
		stringFlag(&cfg.KubernetesVersion, "kubernetes-version", "", "with --talos: the Kubernetes `vX.Y.Z` of kubelet and kube-proxy (default: Talos' default)"),
		stringFlag(&cfg.TalosVersion, "talos-version", "", "warm the worker join set of this Talos release `vX.Y.Z` (implies --talos; known: "+strings.Join(warm.TalosReleases(), ", ")+", and other patches of their minors)"),
		stringFlag(&cfg.MachineConfig, "machine-config", "", "also warm what a node with this machine config `FILE` pulls (talosctl read /system/state/config.yaml, or talosctl get machineconfig -o yaml): the images it names (control-plane ones too), its Talos release's defaults for those it leaves unset (never this build's), and that release's pause and flannel"),
		stringFlag(&cfg.InstallerImage, "installer-image", "", "also warm the Talos installer `REF` an upgrade pulls (machine.install.image, e.g. an image factory reference)"),
		stringFlag(&cfg.ImagesFrom, "images-from", "", "also warm the references in `FILE` (one per line; # comments and blank lines skipped; - reads standard input), after --talos and before IMAGE"),
		boolFlag(&cfg.Pin, "pin", "pin each image at the mirror once it is warm, so that eviction (--max-size, a full disk) never removes it: by tag (the pin follows the tag) or by digest as IMAGE names it. Needs nodecache serve as --mirror, accepting pins from this host (loopback, or its --allow networks); pins may hold at most 80% of serve's --max-size"),
		boolFlag(&cfg.Print, "print", "print the normalised references that would be warmed, one per line (with --output json: with their sources), and exit; nothing is contacted and --mirror is optional"),
		stringFlag(&output, "output", "text", "summary `FORMAT`: text or json"),
	}
	return withConfig(&cli.Command{
		Name:      "warm",
		Usage:     "pre-fill a pull-through cache with images, for one platform only, or write them into a bundle (--to)",
		ArgsUsage: "[IMAGE ...]",
		Description: `Resolves each IMAGE through the mirror, takes from an index only the manifest for --platform
(never attestations or other architectures), and fetches the config and every layer through the
mirror, hashing each while streaming. IMAGE is name[:tag][@digest] (the digest wins); short names
are normalised (nginx -> docker.io/library/nginx:latest). Flags come before IMAGE.

Exit codes: 0 every image warm (at least one blob fetched, none failed; with --pin, pinned) or, with
--to, stored; 1 an image not warm (stored) or not pinned, the mirror not ready within --wait (or not
nodecache serve, with --pin), or --deadline reached; 2 a flag or IMAGE refused (nothing sent).`,
		Flags: append(flags, logFlags(&lc, true)...),
		Action: func(c *cli.Context) error {
			if err := outputFormat(output); err != nil {
				return err
			}
			cfg.Stdin = c.App.Reader
			opts, err := cfg.OptionsContext(c.Context, c.Args().Slice())
			if err != nil { // a refusal (exit 2), or a signal while --images-from waited for input (1)
				return err
			}
			if opts.Talos != nil && opts.Talos.Note != "" {
				opts.Notes = append([]string{opts.Talos.Note}, opts.Notes...)
			}
			if cfg.Print {
				if output == "text" {
					for _, n := range opts.Notes {
						fmt.Fprintf(c.App.ErrWriter, "note: %s\n", n)
					}
				}
				return clitext.Render(c.App.Writer, output, &warm.ImageList{Talos: opts.Talos, Images: opts.Sources, Notes: opts.Notes})
			}
			if opts.Logger, err = lc.logger(); err != nil {
				return err
			}
			for _, n := range opts.Notes {
				opts.Logger.Info().Msg(n)
			}
			return runWarm(c, output, opts)
		},
	})
}

func runWarm(c *cli.Context, output string, opts warm.Options) error {
	opts.Progress = c.App.ErrWriter
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	opts.ProgressBar = writerIsTerminal(opts.Progress)
	rep, err := warm.Run(c.Context, opts)
	if rep == nil {
		return err // options refused (exit 2), or the mirror never ready (1)
	}
	if err := clitext.Render(c.App.Writer, output, rep); err != nil {
		return withCode(exitNegative, err)
	}
	if !rep.OK() {
		return silentExit(exitNegative)
	}
	return nil
}

// writerIsTerminal reports whether w is a terminal, where a redrawn progress bar makes sense;
// anything else (pipe, file, buffer) gets one line per blob.
func writerIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && clitext.IsTerminal(f)
}
