package clitext

import (
	_ "embed"
	"fmt"
)

// The completion scripts of bash and zsh: both ask the binary for the candidates
// (--generate-bash-completion), so they never go stale.
var (
	//go:embed completion/nodecache.bash
	bashCompletion string
	//go:embed completion/nodecache.zsh
	zshCompletion string
)

// Shells are the shells `nodecache completion` writes a script for.
var Shells = []string{"bash", "zsh", "fish"}

// Completion returns the completion script for shell; fish is urfave/cli's, given as fish.
func Completion(shell, fish string) (string, error) {
	switch shell {
	case "bash":
		return bashCompletion, nil
	case "zsh":
		return zshCompletion, nil
	case "fish":
		return fish, nil
	}
	return "", fmt.Errorf("shell %q: want bash, zsh or fish", shell)
}
