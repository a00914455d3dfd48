#compdef nodecache
# zsh completion for nodecache. Load it with:
#   source <(nodecache completion zsh)
# or save it as _nodecache in a directory of $fpath. Candidates come from the binary itself
# (urfave/cli's --generate-bash-completion), so they always match its commands and flags.
_nodecache() {
	local cur=${words[CURRENT]}
	local -a args candidates
	args=("${(@)words[1,CURRENT-1]}")
	if [[ "$cur" == -* ]]; then
		candidates=("${(@f)$("${args[@]}" "$cur" --generate-bash-completion 2>/dev/null)}")
	else
		candidates=("${(@f)$("${args[@]}" --generate-bash-completion 2>/dev/null)}")
	fi
	if [[ -n "${candidates[1]}" ]]; then
		compadd -a candidates
	else
		_files
	fi
}
if [[ "$funcstack[1]" == "_nodecache" ]]; then
	_nodecache "$@"
else
	compdef _nodecache nodecache
fi
