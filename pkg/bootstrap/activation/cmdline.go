package activation

import "strings"

// flagValue returns the value of the first flag among names in args, in any of the forms
// urfave/cli accepts ("--name v", "--name=v", "-name v", "-name=v"; names given without
// dashes). Parsing stops at "--".
func flagValue(args []string, names ...string) (string, bool) {
	for i := 1; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		body := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		key, val, hasVal := strings.Cut(body, "=")
		for _, n := range names {
			if key != n {
				continue
			}
			if hasVal {
				return val, true
			}
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", true
		}
	}
	return "", false
}
