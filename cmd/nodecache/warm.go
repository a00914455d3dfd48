package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/warm"
)

func warmCommand() *cli.Command {
	flags := []cli.Flag{
		stringFlag("mirror", "", "the pull-through cache to fill, at `URL` http(s)://host[:port] (required); warm talks only to it"),
		stringFlag("platform", "", "walk only this `os/arch[/variant]` (containerd's matching rules, no other architecture); default: this machine's"),
		durationFlag("wait", warm.DefaultWait, "wait this long, by wall clock, for the mirror to answer GET /v2/ (0: one probe)"),
		durationFlag("deadline", warm.DefaultDeadline, "stop the whole run after this long, mirror wait included (0: no deadline)"),
		intFlag("concurrency", warm.DefaultConcurrency, "blobs fetched at once"),
		durationFlag("blob-timeout", warm.DefaultBlobTimeout, "longest one attempt at one blob or manifest may take"),
		intFlag("retries", warm.DefaultRetries, "retries per request on 5xx, 429 (honouring Retry-After) and broken streams (0: none)"),
		stringFlag("routing", string(warm.RoutingNS), "how the mirror is told the upstream: ns (?ns=<registry>, like containerd) or path (/v2/<registry>/<repo>, like CRI-O)"),
		boolFlag("talos", "warm the Talos worker join set (kubelet, kube-proxy, pause, flannel) of the Talos version this build knows"),
		stringFlag("kubernetes-version", "", "with --talos: the Kubernetes `vX.Y.Z` of kubelet and kube-proxy (default: Talos' default)"),
		stringFlag("output", "text", "summary format: text or json"),
	}
	return withFlagValueErrors(withConfig(&cli.Command{
		Name:      "warm",
		Usage:     "pre-fill a pull-through cache with images, for one platform only",
		ArgsUsage: "[IMAGE ...]",
		Description: `Resolves each IMAGE through the mirror, takes from an index only the manifest for --platform
(never attestations or other architectures), and fetches the config and every layer through the
mirror, hashing each while streaming. IMAGE is name[:tag][@digest] (the digest wins); short names
are normalised (nginx -> docker.io/library/nginx:latest). Flags come before IMAGE.

Exit codes: 0 every image warm (at least one blob fetched, none failed); 1 an image not warm,
the mirror not ready within --wait, or --deadline reached; 2 a flag or IMAGE refused (nothing sent).`,
		Flags:  append(flags, logFlags()...),
		Action: runWarm,
	}))
}

// flagValueRE matches urfave/cli's report of a flag value that does not parse (the wording of
// Go's flag package: one dash, and no word on what is accepted).
var flagValueRE = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([A-Za-z0-9-]+): parse error$`)

// withFlagValueErrors makes cmd name a flag value that does not parse as --NAME "VALUE" and say
// what the flag accepts (a duration such as 30s, a whole number), then hands the error to the
// command's own OnUsageError (exit 2).
func withFlagValueErrors(cmd *cli.Command) *cli.Command {
	next := cmd.OnUsageError
	cmd.OnUsageError = func(c *cli.Context, err error, sub bool) error {
		err = flagValueError(cmd.Flags, err)
		if next != nil {
			return next(c, err, sub)
		}
		return err
	}
	return cmd
}

// flagValueError rewrites `invalid value "abc" for flag -wait: parse error` into
// `--wait "abc": want a duration such as 500ms, 30s, 5m or 1h30m`; other errors pass unchanged.
func flagValueError(flags []cli.Flag, err error) error {
	m := flagValueRE.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	value, name := m[1], m[2]
	for _, f := range flags {
		if !slices.Contains(f.Names(), name) {
			continue
		}
		want := ""
		switch f.(type) {
		case *altsrc.DurationFlag, *cli.DurationFlag:
			want = "a duration such as 500ms, 30s, 5m or 1h30m"
		case *altsrc.IntFlag, *cli.IntFlag:
			want = "a whole number such as 4"
		case *altsrc.BoolFlag, *cli.BoolFlag:
			want = "true or false"
		default:
			return err
		}
		return fmt.Errorf("--%s %q: want %s", name, value, want)
	}
	return err
}

func runWarm(c *cli.Context) error {
	output, err := outputFormat(c)
	if err != nil {
		return err
	}
	opts, err := warmOptions(c)
	if err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	opts.Logger = log
	opts.Progress = c.App.ErrWriter
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	opts.ProgressBar = writerIsTerminal(opts.Progress)

	rep, err := warm.Run(c.Context, opts)
	if errors.Is(err, warm.ErrRefused) {
		return usagef("%v", err)
	}
	if rep == nil {
		return withCode(exitNegative, err)
	}
	if output == "json" {
		err = rep.WriteJSON(c.App.Writer)
	} else {
		err = rep.WriteText(c.App.Writer)
	}
	if err != nil {
		return withCode(exitNegative, err)
	}
	if !rep.Warm || rep.Error != "" {
		return silentExit(exitNegative)
	}
	return nil
}

// warmOptions binds the flags and arguments; every refusal is an exit-2 usage error that names
// the value, and nothing has been sent yet.
func warmOptions(c *cli.Context) (warm.Options, error) {
	var (
		opts warm.Options
		errs []error
	)
	mirror, err := name.ParseMirror(c.String("mirror"))
	errs = append(errs, err)
	opts.Mirror = mirror.URL
	opts.Routing, err = warm.ParseRouting(c.String("routing"))
	errs = append(errs, err)
	opts.Platform, err = warm.ParsePlatform(c.String("platform"))
	errs = append(errs, err)

	var inputs []string
	if c.Bool("talos") {
		set, err := warm.TalosJoinImages(c.String("kubernetes-version"))
		errs = append(errs, err)
		if err == nil {
			opts.Talos = &set
			inputs = append(inputs, set.Images...)
		}
	} else if c.String("kubernetes-version") != "" {
		errs = append(errs, errors.New("--kubernetes-version applies only with --talos"))
	}
	for _, a := range c.Args().Slice() {
		if strings.HasPrefix(a, "-") {
			errs = append(errs, fmt.Errorf("argument %q looks like a flag: flags go before IMAGE", a))
			continue
		}
		inputs = append(inputs, a)
	}
	if len(inputs) == 0 && !c.Bool("talos") {
		errs = append(errs, errors.New("no IMAGE given: name at least one image or use --talos"))
	}
	for _, in := range inputs {
		ref, err := warm.ParseReference(in)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		opts.Images = append(opts.Images, ref)
	}

	// 0 on the command line means "none" where the package's zero means "default".
	opts.Wait = orNegative(c.Duration("wait"))
	opts.Deadline = orNegative(c.Duration("deadline"))
	if c.Int("retries") < 0 {
		errs = append(errs, fmt.Errorf("--retries %d: want 0 or more", c.Int("retries")))
	}
	opts.Retries = c.Int("retries")
	if opts.Retries == 0 {
		opts.Retries = -1
	}
	if n := c.Int("concurrency"); n < 1 || n > 64 {
		errs = append(errs, fmt.Errorf("--concurrency %d: want 1 to 64", n))
	}
	opts.Concurrency = c.Int("concurrency")
	if d := c.Duration("blob-timeout"); d <= 0 {
		errs = append(errs, fmt.Errorf("--blob-timeout %s: want a positive duration", d))
	}
	opts.BlobTimeout = c.Duration("blob-timeout")
	if c.Duration("wait") < 0 || c.Duration("deadline") < 0 {
		errs = append(errs, errors.New("--wait and --deadline must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return opts, usagef("warm: %v", err)
	}
	return opts, nil
}

func orNegative(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// writerIsTerminal reports whether w is a terminal, where a redrawn progress bar makes sense;
// anything else (pipe, file, buffer) gets one line per blob.
func writerIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}
