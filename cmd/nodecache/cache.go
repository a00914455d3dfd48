package main

import (
	"context"
	"errors"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/inventory"
)

func cacheCommand() *cli.Command {
	sub := func(name, usage, args string, run func(context.Context, *inventory.Client, cli.Args) (clitext.Renderer, error)) *cli.Command {
		var listenURL, output string
		return withConfig(&cli.Command{Name: name, Usage: usage, ArgsUsage: args,
			Description: "Exit codes: 0 done; 1 not cached, serve unreachable or refused; 2 a flag or argument refused.",
			Flags:       []cli.Flag{stringFlag(&listenURL, "listen-url", "http://127.0.0.1:5000", "`URL` where nodecache serve listens"), stringFlag(&output, "output", "text", "report `FORMAT`: text or json")},
			Action: func(c *cli.Context) error {
				cl, err := inventory.New(listenURL, nil)
				if err = errors.Join(err, outputFormat(output)); err == nil {
					var rep clitext.Renderer
					if rep, err = run(c.Context, cl, c.Args()); err == nil {
						return withCode(exitNegative, clitext.Render(c.App.Writer, output, rep))
					}
				}
				usage := &exitError{}
				return withCode(map[bool]int{true: exitUsage, false: exitNegative}[errors.Is(err, inventory.ErrInput) || errors.As(err, &usage)], err)
			}})
	}
	return &cli.Command{Name: "cache", Usage: "list the images a running nodecache serve holds, or evict one",
		Subcommands: []*cli.Command{
			sub("ls", "list cached images, most recently pulled first (GET /nodecache/v1/cache: loopback and --allow networks)", "",
				func(ctx context.Context, cl *inventory.Client, _ cli.Args) (clitext.Renderer, error) {
					return cl.List(ctx)
				}),
			sub("rm", "evict one image as eviction does: blobs another cached manifest references or a request uses stay (DELETE /nodecache/v1/cache/...: loopback only)", "UPSTREAM/REPOSITORY@DIGEST",
				func(ctx context.Context, cl *inventory.Client, args cli.Args) (clitext.Renderer, error) {
					return cl.RemoveArgs(ctx, args.Slice())
				}),
		}}
}
