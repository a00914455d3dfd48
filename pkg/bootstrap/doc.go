// Package bootstrap holds what the runtime writers of `nodecache gen` share: the change set a
// generator plans (files as data), the applier that writes it under a host root atomically with
// backups, the unified diff for --dry-run, the mirror URL rules and the refusal error that maps to
// exit code 2.
//
// One sub-package per runtime builds on it: talos (machine-config patches), containerd
// (hosts.toml and config.toml), crio (registries.conf.d drop-ins). Each offers a pure Plan
// function that only reads the host and returns the changes, and leaves writing to Apply.
//
// Ownership rules (docs/contracts.md, "Files nodecache owns and edits"): files nodecache writes start with Marker and
// only such files are replaced or removed; a user's file that must be edited (containerd's
// config.toml) is first copied to <file>.nodecache.bak, written once and never overwritten;
// unchanged bytes are never rewritten, so mtime and inode stay and activation evidence does not
// flip.
package bootstrap
