// Command nodecache runs a pull-through OCI registry on a node, configures the node's container
// runtime to pull through it, pre-fills it, and proves from runtime evidence that it is used.
package main

//go:generate env NODECACHE_UPDATE_DOCS=1 go test -run TestCLIReferenceIsCurrent .

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/internal/clitext"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		// After the first signal the command shuts down gracefully; a second one ends the
		// process at once (the default action, restored by stop).
		<-ctx.Done()
		stop()
	}()
	err := newApp().RunContext(ctx, os.Args)
	stop()
	os.Exit(report(os.Stderr, err))
}

func newApp() *cli.App {
	return &cli.App{
		Name:                 "nodecache",
		Usage:                "pull container images through a cache on the node itself, and prove that the node really does",
		Description:          clitext.AppDescription,
		Version:              buildinfo.Version(),
		EnableBashCompletion: true,
		Suggest:              true,
		ExitErrHandler:       func(*cli.Context, error) {}, // main decides the exit code
		OnUsageError:         usageError,
		Commands:             commands(),
		Before: clitext.RefuseHelpTopic(func(c *cli.Context, topic string) error {
			if c.App.Command(topic) != nil {
				return nil
			}
			return unknownAppCommand(c.App, topic)
		}),
		Action: unknownCommand,
	}
}

// unknownCommand refuses a missing or unknown command with exit 2: without arguments it shows
// the help on stderr (nodecache --help shows it on stdout and exits 0).
func unknownCommand(c *cli.Context) error {
	if c.Args().Present() {
		return unknownAppCommand(c.App, c.Args().First())
	}
	return helpOnStderr(c, cli.ShowAppHelp)
}

// unknownAppCommand refuses typed as a command of app, suggesting only a close name.
func unknownAppCommand(app *cli.App, typed string) error {
	names := clitext.CommandNames(app.VisibleCommands())
	return usagef("unknown command %q%s commands: %s (see nodecache --help)", typed, clitext.DidYouMean(typed, names), strings.Join(names, ", "))
}

// helpOnStderr shows a help (show writes it to c.App.Writer) on stderr instead and returns the
// usage exit code: a command was missing, and that is refused like any other usage error.
func helpOnStderr(c *cli.Context, show func(*cli.Context) error) error {
	out := c.App.Writer
	c.App.Writer = c.App.ErrWriter
	defer func() { c.App.Writer = out }()
	if err := show(c); err != nil {
		return withCode(exitUsage, err)
	}
	return silentExit(exitUsage)
}
