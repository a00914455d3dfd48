package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/buildinfo"
)

func versionCommand() *cli.Command {
	var output string
	return &cli.Command{
		Name:  "version",
		Usage: "print the nodecache version, commit, and the Talos machinery, containerd and distribution versions built in",
		Description: `Text (default) is one "name  value" line each; --output json is one object:
   {"version", "commit", "go", "platform", "talos_machinery", "containerd", "distribution"}
The library versions are the Go module versions linked into this binary.`,
		Flags: []cli.Flag{
			stringFlag(&output, "output", "text", "output `FORMAT`: text or json"),
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("version takes no arguments, got %q", c.Args().First())
			}
			info := buildinfo.Read()
			switch out := output; out {
			case "json":
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			case "text":
				w := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
				for _, row := range [][2]string{
					{"nodecache", info.Version},
					{"commit", info.Commit},
					{"go", info.Go},
					{"platform", info.Platform},
					{"talos machinery", info.TalosMachinery},
					{"containerd", info.Containerd},
					{"distribution", info.Distribution},
				} {
					fmt.Fprintf(w, "%s\t%s\n", row[0], row[1])
				}
				return w.Flush()
			default:
				return usagef("--output %q: want text or json", out)
			}
		},
	}
}
