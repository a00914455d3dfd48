package clitext

import "github.com/urfave/cli/v2"

// AppDescription is `nodecache --help`'s description. It names no command and counts none: the
// COMMANDS list below it, made from the commands themselves, is the one list (issue 26: "six
// commands" over a list of eight).
const AppDescription = `One binary: serve a pull-through cache, point the node's runtime at it (gen), pre-fill it
(warm), and prove from runtime evidence that the node really pulls through it (status, agent).
'nodecache COMMAND --help' tells what each command does and accepts.

Exit codes: 0 success, 1 ran but the answer is negative or the work failed,
2 usage or input refused (nothing was changed), 3 status cannot tell.`

// DidYouMean is ": did you mean X?" for the name of names closest to typed (Suggest), else
// ";": the separator before the list of accepted names.
func DidYouMean(typed string, names []string) string {
	if s := Suggest(typed, names); s != "" {
		return ": did you mean " + s + "?"
	}
	return ";"
}

// RefuseHelpTopic is a Before hook that hands `help TOPIC` (or `h TOPIC`) to check, which
// refuses a TOPIC that is no command the way the command itself refuses it. urfave/cli would
// exit 3 ("status cannot tell" here) and suggest any name, however far off.
func RefuseHelpTopic(check func(c *cli.Context, topic string) error) cli.BeforeFunc {
	return func(c *cli.Context) error {
		a := c.Args()
		if topic := a.Get(1); (a.First() == "help" || a.First() == "h") && topic != "" && topic != "help" && topic != "h" {
			return check(c, topic)
		}
		return nil
	}
}

// CommandNames are the names of cmds, the help command left out.
func CommandNames(cmds []*cli.Command) []string {
	var names []string
	for _, c := range cmds {
		if c.Name != "help" {
			names = append(names, c.Name)
		}
	}
	return names
}
