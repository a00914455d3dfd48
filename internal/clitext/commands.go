package clitext

import "github.com/urfave/cli/v2"

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
