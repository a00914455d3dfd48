package main

import (
	"errors"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/inventory"
)

func cacheCommand() *cli.Command {
	sub := func(name, usage, args string, flags ...cli.Flag) *cli.Command {
		var listenURL, output string
		return withConfig(&cli.Command{Name: name, Usage: usage, ArgsUsage: args,
			Description: inventory.ExitCodes(name),
			Flags:       append([]cli.Flag{stringFlag(&listenURL, "listen-url", "http://127.0.0.1:5000", "`URL` where nodecache serve listens"), stringFlag(&output, "output", "text", "report `FORMAT`: text or json")}, flags...),
			Action: func(c *cli.Context) error {
				cl, err := inventory.New(listenURL, nil)
				if err = errors.Join(err, outputFormat(output)); err == nil {
					var rep clitext.Renderer
					if rep, err = cl.Command(c.Context, name, c.Args().Slice(), inventory.CommandFlags{Rate: c.String("rate"), Ref: c.String("ref")}, c.App.ErrWriter); err == nil {
						return withCode(exitNegative, errors.Join(clitext.Render(c.App.Writer, output, rep), inventory.Verdict(rep)))
					}
				}
				return withCode(map[bool]int{true: exitUsage, false: exitNegative}[errors.Is(err, inventory.ErrInput) || errors.As(err, new(*exitError))], err)
			}})
	}
	return &cli.Command{Name: "cache", Usage: "list the images a running nodecache serve holds, evict one, verify every stored blob, pin and unpin images and list the pins, or import a bundle of images",
		Subcommands: []*cli.Command{
			sub("ls", "list cached images, most recently pulled first, pinned ones marked (GET /nodecache/v1/cache: loopback and --allow networks)", ""),
			sub("rm", "evict one image as eviction does: blobs another cached manifest references or a request uses stay; a pinned image is refused (unpin it first) (DELETE /nodecache/v1/cache/...: loopback only)", "UPSTREAM/REPOSITORY@DIGEST|UPSTREAM/REPOSITORY:TAG"),
			sub("verify", "read every stored blob whole, at most --rate bytes a second, evicting each that does not match its digest (the next pull fetches it again); progress on stderr (POST /nodecache/v1/cache/verify: loopback and --allow networks)", "",
				stringFlag(nil, "rate", "", "read at most `RATE`, bytes a second in binary units (200MiB, 1GiB/s); default: serve's --scrub-rate")),
			sub("pin", "pin what the cache holds of an image so that eviction (--max-size, a full disk) never removes it; a pin by tag follows the tag to the image a revalidation finds. Nothing is fetched: an image not cached is refused (nodecache warm --pin fetches and pins); pins may hold at most 80% of --max-size (PUT /nodecache/v1/cache/pins/...: loopback and --allow networks)", "UPSTREAM/REPOSITORY:TAG|UPSTREAM/REPOSITORY@DIGEST"),
			sub("pins", "list the pins: what each was made by (a tag, which it follows, or a digest), the manifest it holds, its size, when it was made; then the pinned total against the 80% of --max-size pins may hold (GET /nodecache/v1/cache/pins: loopback and --allow networks)", ""),
			sub("unpin", "drop a pin, by the tag or digest it was pinned by: what it held is evicted again like anything else (DELETE /nodecache/v1/cache/pins/...: loopback and --allow networks)", "UPSTREAM/REPOSITORY:TAG|UPSTREAM/REPOSITORY@DIGEST"),
			sub("import", "store and pin the images of a bundle in DIR (an OCI image layout or a Talos image cache, detected) on serve, over HTTP: the blobs serve lacks are read and checked first, a bundle with a missing or damaged blob is refused naming it, and nothing is half-imported; progress on stderr (POST /nodecache/v1/cache/import: loopback and --allow networks)", "DIR",
				stringFlag(nil, "ref", "", "name the images of an OCI image layout whose index.json does not: `REGISTRY/REPOSITORY` for one named by a tag alone (skopeo copy … oci:DIR:TAG), REGISTRY/REPOSITORY[:TAG] for one with no name (crane pull --format oci without --annotate-ref); refused for a bundle that names its images")),
		}}
}
