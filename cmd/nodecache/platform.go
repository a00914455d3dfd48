package main

import (
	"slices"

	"github.com/urfave/cli/v2"
)

// linuxOnlyCommands are the commands that read a Linux node: /proc, the runtime's sockets and
// files. Release builds for other systems (darwin, for gen talos and warm) refuse them.
var linuxOnlyCommands = []string{"status", "agent"}

// guardLinuxOnly makes the linuxOnlyCommands among cmds exit 2 with "Linux only" when goos is not
// linux (runtime.GOOS in the binary); their --help still works.
func guardLinuxOnly(cmds []*cli.Command, goos string) {
	if goos == "linux" {
		return
	}
	for _, c := range cmds {
		if slices.Contains(linuxOnlyCommands, c.Name) {
			c.Action = func(*cli.Context) error {
				return usagef("nodecache %s is Linux only: it reads a Linux node's /proc and container runtime (this is %s; gen, warm, serve and version work here)", c.Name, goos)
			}
		}
	}
}
