package warm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

// Config is `nodecache warm` as the command line gives it, one field per flag; Options checks
// it together with the IMAGE arguments. Unlike Options, a zero Wait, Deadline or Retries means
// "none" here, as on the command line.
type Config struct {
	// Mirror is --mirror, the cache to fill (http(s)://host[:port]).
	Mirror string
	// To is --to: write a bundle into this directory from the upstreams instead of filling
	// Mirror. Format (--format: oci, the default, or talos-flat) and Upstreams (--upstream
	// NAME[=URL] values as serve takes them, repeated or comma-separated; empty: serve's
	// default set) apply only with it.
	To, Format string
	Upstreams  []string
	// UpstreamAuth and UpstreamCA are --upstream-auth and --upstream-ca, NAME=FILE values as
	// serve takes them (repeated or comma-separated), only with To: the credentials in a docker
	// config.json, and a private CA, for upstream NAME (upstreamauth.Load).
	UpstreamAuth, UpstreamCA []string
	// Platform is --platform os/arch[/variant]; empty: this machine's. With To, "all" keeps
	// every platform of an index.
	Platform string
	// PlatformMatch is --platform-match: transfer (default) or only.
	PlatformMatch string
	// Routing is --routing: ns or path.
	Routing string
	// Wait and Deadline are --wait and --deadline (0: one probe, no deadline).
	Wait, Deadline time.Duration
	// BlobTimeout is --blob-timeout (positive).
	BlobTimeout time.Duration
	// Concurrency is --concurrency (1 to 64) and Retries --retries (0 or more).
	Concurrency, Retries int
	// Talos adds the Talos worker join set; KubernetesVersion overrides its kubelet and
	// kube-proxy version (only with Talos).
	Talos             bool
	KubernetesVersion string
	// TalosVersion is --talos-version: the Talos release whose join set to warm (implies Talos).
	TalosVersion string
	// MachineConfig is --machine-config: a node's machine config whose images (and its Talos
	// release's defaults) are warmed after the join set.
	MachineConfig string
	// InstallerImage is --installer-image: the installer a Talos upgrade pulls
	// (machine.install.image), warmed after the join set.
	InstallerImage string
	// ImagesFrom is --images-from: a file with one reference per line, "-" for Stdin. Its
	// images come after the Talos set and before the IMAGE arguments.
	ImagesFrom string
	// Stdin is what --images-from - reads; nil means os.Stdin.
	Stdin io.Reader
	// Print is --print: only list the references (Options.Sources); --mirror is then optional.
	Print bool
	// Pin is --pin: pin each image at the mirror once it is warm (Options.Pin).
	Pin bool
}

// Options checks c and the IMAGE arguments and returns the Options for Run. Every problem is
// reported: the error is one refusal (ErrRefused), "warm: " and the problems joined, each naming
// the flag or value, and nothing has been sent.
func (c Config) Options(args []string) (Options, error) {
	var (
		opts Options
		errs []error
		err  error
	)
	switch {
	case c.To != "":
		b, err := c.bundle()
		errs = append(errs, err)
		opts.Bundle = b
	case c.Mirror != "" || !c.Print:
		mirror, err := name.ParseMirror(c.Mirror)
		errs = append(errs, err)
		opts.Mirror = mirror.URL
	}
	if c.To == "" && len(c.UpstreamAuth)+len(c.UpstreamCA) > 0 {
		// Not refused: a settings file or environment shared with serve gives them to every
		// command (docs/settings.md), as it gives --upstream, which is unused here too.
		opts.Notes = append(opts.Notes, "--upstream-auth and --upstream-ca not used: they apply only with --to; warm asks only the mirror, whose serve reaches the upstreams")
	}
	opts.Routing, err = ParseRouting(c.Routing)
	errs = append(errs, err)
	switch {
	case c.Platform == platformAll && c.To == "":
		errs = append(errs, refusal.Value("--platform", c.Platform, "all applies only with --to (a bundle keeps every platform of an index); a mirror is warmed for one platform: want os/arch[/variant]"))
	case c.Platform != platformAll:
		opts.Platform, err = ParsePlatform(c.Platform)
		errs = append(errs, err)
	}
	opts.PlatformMatch, err = ParsePlatformMatch(c.PlatformMatch)
	errs = append(errs, err)

	inputs, inputErrs := c.inputs(args, &opts)
	errs = append(errs, inputErrs...)
	refs, srcs, refErrs := sources(inputs)
	opts.Images, opts.Sources = refs, srcs
	errs = append(errs, refErrs...)
	errs = append(errs, c.setLimits(&opts)...)
	opts.Pin = c.Pin
	if err := errors.Join(errs...); err != nil {
		// Every problem is the user's to fix, the ones not refused on their own too (--retries,
		// a flag-like argument, a read error of --images-from -), so the whole is one refusal.
		return opts, &refusal.Error{Reason: "warm: " + err.Error(), Err: err}
	}
	return opts, nil
}

// inputs are the images named, from the sources in order: the Talos set (opts.Talos), the
// machine config (its note in opts.Notes), --installer-image, --images-from, the arguments.
// Nothing to warm is a problem too.
func (c Config) inputs(args []string, opts *Options) ([]input, []error) {
	var (
		inputs []input
		errs   []error
	)
	if c.Talos || (c.TalosVersion != "" && c.MachineConfig == "") {
		set, err := TalosJoinImagesFor(c.TalosVersion, c.KubernetesVersion)
		errs = append(errs, err)
		if err == nil {
			opts.Talos = &set
			for i, im := range set.Images {
				inputs = append(inputs, input{text: im, from: "--talos " + set.TalosVersion + " (" + set.roles[i] + ")"})
			}
		}
	} else if c.KubernetesVersion != "" {
		errs = append(errs, errors.New("--kubernetes-version applies only with --talos or --talos-version"))
	}
	if c.MachineConfig != "" {
		list, note, err := machineConfigInputs(c.MachineConfig, c.TalosVersion)
		errs = append(errs, err)
		inputs = append(inputs, list...)
		if note != "" {
			opts.Notes = append(opts.Notes, note)
		}
	}
	if c.InstallerImage != "" {
		inputs = append(inputs, input{text: c.InstallerImage, from: "--installer-image"})
	}
	listRead := false
	if c.ImagesFrom != "" {
		list, err := c.readImagesFrom()
		errs = append(errs, err)
		inputs = append(inputs, list...)
		listRead = err == nil
	}
	for i, a := range args {
		if strings.HasPrefix(a, "-") {
			errs = append(errs, fmt.Errorf("argument %q looks like a flag: flags go before IMAGE", a))
			continue
		}
		inputs = append(inputs, input{text: a, from: fmt.Sprintf("argument %d", i+1)})
	}
	// Nothing to warm is refused alike with and without --print: an image list that is empty
	// (or only blank lines and comments) and nothing else named. A source that failed already
	// said why.
	if len(inputs) == 0 {
		switch {
		case c.ImagesFrom == "" && !c.Talos && c.TalosVersion == "" && c.MachineConfig == "":
			errs = append(errs, errors.New("nothing to warm: no IMAGE given; "+nameSomething))
		case listRead && !c.Talos && c.TalosVersion == "" && c.MachineConfig == "":
			errs = append(errs, fmt.Errorf("nothing to warm: --images-from %s lists no image (it is empty, or only blank lines and # comments); put references in it, name an IMAGE, or use --talos, --talos-version or --machine-config", c.ImagesFrom))
		}
	}
	return inputs, errs
}

// setLimits sets the waits, retries, concurrency and blob timeout of opts and returns the
// problems with them.
func (c Config) setLimits(opts *Options) []error {
	var errs []error
	// 0 on the command line means "none" where Options' zero means "default".
	opts.Wait, opts.Deadline = orNegative(c.Wait), orNegative(c.Deadline)
	if c.Retries < 0 {
		errs = append(errs, fmt.Errorf("--retries %d: want 0 or more", c.Retries))
	}
	opts.Retries = c.Retries
	if opts.Retries == 0 {
		opts.Retries = -1
	}
	if c.Concurrency < 1 || c.Concurrency > 64 {
		errs = append(errs, fmt.Errorf("--concurrency %d: want 1 to 64", c.Concurrency))
	}
	opts.Concurrency = c.Concurrency
	if c.BlobTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--blob-timeout %s: want a positive duration", c.BlobTimeout))
	}
	opts.BlobTimeout = c.BlobTimeout
	if c.Wait < 0 || c.Deadline < 0 {
		errs = append(errs, errors.New("--wait and --deadline must not be negative"))
	}
	return errs
}

// OptionsContext is Options, ended by ctx: reading --images-from from standard input or a
// named pipe waits for its writer, and a signal (ctx ending) must still end the command. When
// ctx ends first it returns an error that wraps ctx's and names what was being read (not
// ErrRefused: nothing was refused); the read itself is left to the process's exit.
func (c Config) OptionsContext(ctx context.Context, args []string) (Options, error) {
	if c.ImagesFrom == "" {
		return c.Options(args)
	}
	type result struct {
		opts Options
		err  error
	}
	done := make(chan result, 1)
	go func() {
		o, err := c.Options(args)
		done <- result{o, err}
	}()
	select {
	case r := <-done:
		return r.opts, r.err
	case <-ctx.Done():
		return Options{}, fmt.Errorf("stopped while reading --images-from %s (no end of input yet): %w", c.ImagesFrom, context.Cause(ctx))
	}
}

// platformAll is --platform all (with --to).
const platformAll = "all"

// bundle checks the flags of --to: --mirror not given as well, --format, --upstream.
func (c Config) bundle() (*BundleOptions, error) {
	var errs []error
	if c.Mirror != "" {
		errs = append(errs, refusal.Errorf("--mirror %s and --to %s: warm fills a mirror or writes a bundle, not both; give one", c.Mirror, c.To))
	}
	if c.Pin {
		errs = append(errs, refusal.Errorf("--pin and --to %s: --pin pins images at a running nodecache serve, and a bundle has none; the images of a bundle are pinned when it is imported (nodecache cache import, serve --seed): drop --pin", c.To))
	}
	f, err := bundle.ParseFormat(c.Format)
	errs = append(errs, err)
	b := &BundleOptions{Dir: c.To, Format: f, AllPlatforms: c.Platform == platformAll}
	switch ups, err := name.ParseUpstreams(clitext.SplitList(c.Upstreams)); {
	case err != nil:
		errs = append(errs, err)
	case len(ups) == 0 && len(c.Upstreams) > 0:
		errs = append(errs, errors.New("--upstream is empty (an empty --upstream or NODECACHE_UPSTREAM= gives none): want NAME[=URL], repeatable or comma-separated, e.g. docker.io or ghcr.io=https://ghcr.io; leave it unset for serve's default set"))
	default:
		b.Upstreams = ups
		if len(ups) == 0 {
			ups = name.DefaultUpstreams()
		}
		b.Credentials, b.RootCAs, err = upstreamauth.Load(clitext.SplitList(c.UpstreamAuth), clitext.SplitList(c.UpstreamCA), ups, zerolog.Nop())
		errs = append(errs, err)
	}
	return b, errors.Join(errs...)
}

// nameSomething says what gives warm images.
const nameSomething = "name at least one IMAGE, or use --images-from, --talos, --talos-version or --machine-config"

// readImagesFrom reads --images-from: a regular file or a pipe (`<(cmd)`) of at most
// inputfile.ImageList.Limit bytes, or Stdin for "-", bounded the same. A file that cannot be
// read, is of another type (directory, device, socket) or is larger is refused, naming it.
func (c Config) readImagesFrom() ([]input, error) {
	if c.ImagesFrom == "-" {
		r := c.Stdin
		if r == nil {
			r = os.Stdin
		}
		lr := &io.LimitedReader{R: r, N: inputfile.ImageList.Limit + 1}
		in, err := readImageList(lr, "-")
		if err == nil && lr.N == 0 {
			return nil, refusal.Value("--images-from", "-", "standard input holds more than "+inputfile.Size(inputfile.ImageList.Limit)+"; want "+inputfile.ImageList.Name+" of at most that size")
		}
		return in, err
	}
	b, err := inputfile.Read(c.ImagesFrom, inputfile.ImageList)
	if inputfile.Refused(err) {
		return nil, refusal.Value("--images-from", c.ImagesFrom, err.Error()+", or - for standard input")
	}
	if err != nil {
		return nil, refusal.Value("--images-from", c.ImagesFrom, fmt.Sprintf("cannot read it (%v); want a file with one reference per line, or - for standard input", errors.Unwrap(err)))
	}
	return readImageList(bytes.NewReader(b), c.ImagesFrom)
}

func orNegative(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
