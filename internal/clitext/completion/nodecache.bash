# bash completion for nodecache. Load it with:
#   source <(nodecache completion bash)
# or save it as /etc/bash_completion.d/nodecache. Candidates come from the binary itself
# (urfave/cli's --generate-bash-completion), so they always match its commands and flags.
_nodecache_complete() {
	local cur="${COMP_WORDS[COMP_CWORD]}"
	local -a args=("${COMP_WORDS[@]:0:COMP_CWORD}")
	local candidates
	if [[ "$cur" == -* ]]; then
		candidates=$("${args[@]}" "$cur" --generate-bash-completion 2>/dev/null)
	else
		candidates=$("${args[@]}" --generate-bash-completion 2>/dev/null)
	fi
	COMPREPLY=($(compgen -W "$candidates" -- "$cur"))
}
complete -o bashdefault -o default -F _nodecache_complete nodecache
