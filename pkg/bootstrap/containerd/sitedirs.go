package containerd

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/pelletier/go-toml/v2"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// A site's own per-host directories (containerd docs/hosts.md, "Port Handling in Registry Host"
// and "Support for Docker's Certificate File Pattern"; hostPaths in
// core/remotes/docker/config/config_unix.go). containerd looks up a registry host under
// config_path in the order <host>_<port>_, <host>:<port>, _default and uses the first directory
// that exists: its hosts.toml, or, without one, its *.crt (CA) and *.cert/*.key (client) files. A directory nodecache did not write is the site's configuration:
// gen adds the mirror to it and never creates a directory that would be read before it.

// dirKind is what a per-host directory holds, as containerd reads it.
type dirKind int

const (
	dirAbsent    dirKind = iota // no such directory
	dirEmpty                    // a directory holding nothing containerd reads
	dirOurs                     // hosts.toml starting with mirrorapi.ManagedMarker
	dirSiteHosts                // the site's hosts.toml (not empty, not ours)
	dirSiteCerts                // no hosts.toml, but *.crt, *.cert or *.key files
)

// hostDir is one candidate directory for a registry host.
type hostDir struct {
	name  string // directory name under the hosts directory
	path  string // host path of the directory
	kind  dirKind
	hosts []byte     // hosts.toml content (ours or the site's)
	cas   []string   // *.crt host paths, in name order (containerd's loadCertFiles)
	pairs [][]string // *.cert host paths with their *.key ("" when absent)
}

// readHostDir classifies dir/name as containerd would read it.
func readHostDir(fsys fs.FS, dir, name string) (hostDir, error) {
	d := hostDir{name: name, path: path.Join(dir, name)}
	fi, err := fs.Stat(fsys, bootstrap.FSName(d.path))
	if err != nil || !fi.IsDir() {
		return d, nil // absent (a file named like the directory is not read as one either)
	}
	d.kind = dirEmpty
	data, ok, err := bootstrap.ReadFile(fsys, path.Join(d.path, "hosts.toml"))
	if err != nil {
		return d, err
	}
	if ok && len(data) > 0 {
		d.hosts = data
		d.kind = dirSiteHosts
		if mirrorapi.Managed(data) {
			d.kind = dirOurs
		}
		return d, nil
	}
	ents, err := fs.ReadDir(fsys, bootstrap.FSName(d.path))
	if err != nil {
		return d, fmt.Errorf("read %s: %w", d.path, err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		n := e.Name()
		switch {
		case strings.HasSuffix(n, ".crt"):
			d.cas = append(d.cas, path.Join(d.path, n))
		case strings.HasSuffix(n, ".cert"):
			key := strings.TrimSuffix(n, ".cert") + ".key"
			pair := []string{path.Join(d.path, n), ""}
			if _, err := fs.Stat(fsys, bootstrap.FSName(path.Join(d.path, key))); err == nil {
				pair[1] = path.Join(d.path, key)
			}
			d.pairs = append(d.pairs, pair)
		case strings.HasSuffix(n, ".key"):
		default:
			continue
		}
		d.kind = dirSiteCerts
	}
	return d, nil
}

// hostsPlan is how one registry host's hosts.toml is written.
type hostsPlan struct {
	// dir is the directory name used under the hosts directory.
	dir     string
	changes []bootstrap.Change
	// adopted: the site's own hosts.toml gets the mirror added (not a file of ours).
	adopted bool
	// own: the directory is nodecache's (created or written by an earlier gen), so a site
	// _default/hosts.toml no longer applies to this host.
	own bool
}

// planHostsFile plans host's hosts.toml in hostsDir: render builds our file (given the TLS files
// of a site directory that has only certificates), mirror is the [host] table added to a site's
// own hosts.toml. The directory containerd reads first decides:
//   - none, an empty one, or ours: our file there (a new directory is named "host_port_");
//   - one with only certificates: our file there, its server carrying those certificates as
//     containerd's loadCertFiles would (a hosts.toml makes containerd ignore them);
//   - one with the site's hosts.toml: adopted (adoptHosts).
//
// An earlier gen's own "host_port_" directory that shadows a site "host:port" directory is
// removed and the site's adopted instead.
func planHostsFile(fsys fs.FS, hostsDir, host string, render func(cas []string, pairs [][]string) ([]byte, error), mirror hostEntry) (hostsPlan, error) {
	chosen, changes, err := chooseHostDir(fsys, hostsDir, host)
	if err != nil {
		return hostsPlan{}, err
	}
	hp := hostsPlan{dir: chosen.name, changes: changes}
	file := path.Join(chosen.path, "hosts.toml")
	switch chosen.kind {
	case dirSiteHosts:
		c, err := adoptHosts(file, chosen.hosts, host, mirror)
		if err != nil {
			return hostsPlan{}, err
		}
		hp.adopted = true
		hp.changes = append(hp.changes, c)
		return hp, nil
	case dirSiteCerts:
		data, err := render(chosen.cas, chosen.pairs)
		if err != nil {
			return hostsPlan{}, err
		}
		c, err := bootstrap.PlanOwned(fsys, file, hostsMode, data)
		if err != nil {
			return hostsPlan{}, err
		}
		c.Note = fmt.Sprintf("%s holds the site's certificates and no hosts.toml: the hosts.toml written there keeps them for %s", chosen.path, host)
		hp.changes = append(hp.changes, c)
		return hp, nil
	}
	data, err := render(nil, nil)
	if err != nil {
		return hostsPlan{}, err
	}
	c, err := bootstrap.PlanOwned(fsys, file, hostsMode, data)
	if err != nil {
		return hostsPlan{}, err
	}
	hp.own = true
	hp.changes = append(hp.changes, c)
	return hp, nil
}

// chooseHostDir is the directory containerd reads first for host in hostsDir ("host_port_" under
// hostsDir when there is none), and the removal of an earlier gen's own directory that shadows a
// site's (the site's is chosen then).
func chooseHostDir(fsys fs.FS, hostsDir, host string) (hostDir, []bootstrap.Change, error) {
	var cands []hostDir
	for _, n := range name.HostDirs(host) {
		d, err := readHostDir(fsys, hostsDir, n)
		if err != nil {
			return hostDir{}, nil, err
		}
		cands = append(cands, d)
	}
	chosen := hostDir{name: name.HostDir(host), path: path.Join(hostsDir, name.HostDir(host))}
	for i, d := range cands {
		if d.kind == dirAbsent {
			continue
		}
		if d.kind != dirOurs || !upstreamOnly(d.name, d.hosts) {
			return d, nil, nil
		}
		// Ours first, a site directory after it: ours shadows the site's (an older gen did
		// that). Give the site's directory back its place.
		for _, later := range cands[i+1:] {
			if later.kind != dirSiteHosts && later.kind != dirSiteCerts {
				continue
			}
			c, ok, _, err := bootstrap.PlanRemoveOwned(fsys, path.Join(d.path, "hosts.toml"), true)
			if err != nil {
				return hostDir{}, nil, err
			}
			if !ok {
				return later, nil, nil
			}
			c.Note = fmt.Sprintf("shadowed the site's %s (containerd reads %s first): removed, the site's directory gets the mirror", later.path, d.name)
			return later, []bootstrap.Change{c}, nil
		}
		return d, nil, nil
	}
	return chosen, nil, nil
}

// The lines around the [host] table gen adds to a site's hosts.toml. Everything outside them is
// the site's, byte for byte.
const (
	adoptBegin = "# nodecache: mirror added by `nodecache gen containerd`; the file before: hosts.toml.nodecache.bak; `gen containerd --remove` takes it out"
	adoptEnd   = "# nodecache: end of mirror"
)

// adoptedBlock finds the block gen added to a site's hosts.toml: data[begin:end] runs from its
// first marker line through its end marker line and the blank line after it. ok is false when
// data has no complete block.
func adoptedBlock(data []byte) (begin, end int, ok bool) {
	begin = -1
	if bytes.HasPrefix(data, []byte(adoptBegin+"\n")) {
		begin = 0
	} else if i := bytes.Index(data, []byte("\n"+adoptBegin+"\n")); i >= 0 {
		begin = i + 1
	}
	if begin < 0 {
		return 0, 0, false
	}
	rel := bytes.Index(data[begin:], []byte("\n"+adoptEnd+"\n"))
	if rel < 0 {
		return 0, 0, false
	}
	end = begin + rel + len("\n"+adoptEnd+"\n")
	if end < len(data) && data[end] == '\n' {
		end++
	}
	return begin, end, true
}

// stripAdopted returns data without the block gen added (and the blank line after it), and
// whether there was one.
func stripAdopted(data []byte) ([]byte, bool) {
	begin, end, ok := adoptedBlock(data)
	if !ok {
		return data, false
	}
	return append(slices.Clone(data[:begin]), data[end:]...), true
}

// AdoptedMirror returns the mirror URL (scheme://host:port, as gen wrote it) of the [host] table
// `gen containerd` added to a site's hosts.toml between its marker comment lines, and whether
// data holds such a block with exactly one [host] table that parses. A site file gen adopted
// carries no mirrorapi.ManagedMarker; this is how status tells it was written with nodecache's
// mirror.
func AdoptedMirror(data []byte) (string, bool) {
	begin, end, ok := adoptedBlock(data)
	if !ok {
		return "", false
	}
	var doc struct {
		Host map[string]map[string]any `toml:"host"`
	}
	if err := toml.Unmarshal(data[begin:end], &doc); err != nil || len(doc.Host) != 1 {
		return "", false
	}
	for u := range doc.Host {
		return u, true
	}
	return "", false
}

// insertAdopted adds the mirror's [host] table to a site's hosts.toml as the first host table:
// before the first table header (and the comment lines directly above it), or at the end when
// the file has no table. Nothing else changes; stripAdopted undoes it.
func insertAdopted(orig []byte, mirror hostEntry) ([]byte, error) {
	doc, err := parseTOMLDoc(orig)
	if err != nil {
		return nil, err
	}
	table, err := hostTable(mirror)
	if err != nil {
		return nil, err
	}
	block := adoptBegin + "\n" + string(table) + adoptEnd + "\n"
	if len(doc.headers) == 0 {
		out := slices.Clone(orig)
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		return append(out, block...), nil
	}
	off := doc.headers[0].start
	for off > 0 {
		prev := lineStart(orig, off-1)
		if !strings.HasPrefix(strings.TrimSpace(string(orig[prev:off])), "#") {
			break
		}
		off = prev
	}
	out := slices.Clone(orig[:off])
	out = append(out, block+"\n"...)
	return append(out, orig[off:]...), nil
}

// adoptHosts plans the site's hosts.toml at file (current content cur) with the mirror added as
// its first host: an edit with bootstrap.BackupSuffix backup. The result is checked with
// containerd's own parser (config.ConfigureHosts over a private copy): when containerd does not
// put the mirror first — it ignores a hosts.toml it cannot parse — the file is refused, named.
func adoptHosts(file string, cur []byte, host string, mirror hostEntry) (bootstrap.Change, error) {
	orig, _ := stripAdopted(cur)
	next, err := insertAdopted(orig, mirror)
	if err != nil {
		return bootstrap.Change{}, refusal.Errorf("%s: the site's hosts.toml is not TOML (%v): containerd ignores it and uses only the directory's certificate files; fix it, then run gen again; nothing was changed", file, err)
	}
	if err := checkAdopted(file, next, host, mirror); err != nil {
		return bootstrap.Change{}, err
	}
	c := bootstrap.PlanEdit(file, cur, next)
	c.Note = "the site's hosts.toml: the mirror added as its first host, the rest kept"
	return c, nil
}

// checkAdopted asks containerd's ConfigureHosts which hosts it tries for host with data as the
// hosts.toml: the mirror must come first. A private copy holds only hosts.toml, so the TLS files
// it names may be missing there: containerd reports that only after parsing, which is what is
// checked.
func checkAdopted(file string, data []byte, host string, mirror hostEntry) error {
	tmp, err := os.MkdirTemp("", "nodecache-hosts-")
	if err != nil {
		return fmt.Errorf("check %s: %w", file, err)
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "host")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("check %s: %w", file, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), data, 0o600); err != nil {
		return fmt.Errorf("check %s: %w", file, err)
	}
	hosts := config.ConfigureHosts(context.Background(), config.HostOptions{HostDir: func(string) (string, error) { return dir, nil }})
	list, err := hosts(host)
	if err != nil {
		msg := err.Error()
		if strings.Contains(msg, "unable to read CA cert") || strings.Contains(msg, "unable to read CERT file") || strings.Contains(msg, "failed to load X509 key pair") {
			return nil // parsed: only the TLS files are not in the private copy
		}
		return refusal.Errorf("%s: containerd's hosts.toml parser refuses it with the mirror added (%v): nothing was changed", file, err)
	}
	want := strings.TrimSuffix(mirror.URL, "/")
	if len(list) == 0 || list[0].Scheme+"://"+list[0].Host != want {
		detail := ""
		var probe map[string]any
		if err := toml.Unmarshal(data, &probe); err != nil {
			detail = fmt.Sprintf(" (%v)", err)
		}
		return refusal.Errorf("%s: containerd's hosts.toml parser does not accept the site's hosts.toml%s, so containerd ignores it and uses only the directory's certificate files: fix it, then run gen again; nothing was changed", file, detail)
	}
	return nil
}

// planUnadopt plans taking the mirror out of a site's hosts.toml gen adopted: the backup moved
// back when the file is otherwise as it was (byte for byte the original), else the block removed
// and the site's later changes kept. ok is false for a file without our block. A backup that is a
// symbolic link is refused (ErrRefused, bootstrap.ReadBackup).
func planUnadopt(fsys fs.FS, file string, data []byte) (bootstrap.Change, bool, error) {
	stripped, ok := stripAdopted(data)
	if !ok {
		return bootstrap.Change{}, false, nil
	}
	real, err := bootstrap.Resolve(fsys, file)
	if err != nil {
		return bootstrap.Change{}, false, err
	}
	bak := real + bootstrap.BackupSuffix
	orig, exists, err := bootstrap.ReadBackup(fsys, bak)
	if err != nil {
		return bootstrap.Change{}, false, err
	}
	if exists && (bytes.Equal(stripped, orig) || bytes.Equal(stripped, append(slices.Clone(orig), '\n'))) {
		return bootstrap.Change{Path: file, Action: bootstrap.ActionRestore, Old: data, New: orig, Backup: bak,
			Note: "the site's hosts.toml restored from its backup"}, true, nil
	}
	c := bootstrap.PlanEdit(file, data, stripped)
	c.Note = "the site's hosts.toml changed since gen added the mirror: the mirror's table taken out, the rest kept"
	return c, true, nil
}

// defaultShadowed reports a site's _default directory (hosts.toml or certificates) under
// hostsDir, which containerd no longer reads for hosts that have their own directory.
func defaultShadowed(fsys fs.FS, hostsDir string) (string, error) {
	d, err := readHostDir(fsys, hostsDir, "_default")
	if err != nil {
		return "", err
	}
	switch d.kind {
	case dirSiteHosts:
		return path.Join(d.path, "hosts.toml"), nil
	case dirSiteCerts:
		return d.path, nil
	}
	return "", nil
}
