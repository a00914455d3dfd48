package upstreamauth

import (
	"crypto/x509"
	"fmt"
	"strings"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/name"
)

// Load reads the --upstream-auth and --upstream-ca values of a command, each NAME=FILE with
// NAME one of the upstreams ups (an alias of Docker Hub such as index.docker.io names docker.io),
// and returns the credentials (LoadCredentials) and certificate pools (LoadRootCAs; the
// certificates of every --upstream-ca file of one NAME together) by upstream name. The files of
// an offline upstream are not read (a credential helper could reach out): it is never asked;
// log says so.
//
// Errors: a value is not NAME=FILE, NAME is not among ups (the error lists them), an
// --upstream-auth NAME given twice, or a file cannot be used; each names the flag and the value.
func Load(auth, ca []string, ups []name.Upstream, log zerolog.Logger) (map[string]*Credentials, map[string]*x509.CertPool, error) {
	offline := map[string]bool{}
	for _, u := range ups {
		offline[u.Name] = u.Offline
	}
	creds, authFiles := map[string]*Credentials{}, map[string]string{}
	for _, spec := range auth {
		n, file, err := fileSpec("upstream-auth", spec, ups)
		if err != nil {
			return nil, nil, err
		}
		if seen, ok := authFiles[n]; ok {
			return nil, nil, fmt.Errorf("--upstream-auth %s is given twice (%s and %s): an upstream is asked with one credentials file; give one", n, seen, file)
		}
		authFiles[n] = file
		if offline[n] {
			log.Info().Str("upstream", n).Str("file", file).Msg("--upstream-auth of an offline upstream: not read, the upstream is never asked")
			continue
		}
		if creds[n], err = LoadCredentials(file, n, CredentialsOptions{Logger: log}); err != nil {
			return nil, nil, fmt.Errorf("--upstream-auth %s: %w", n, err)
		}
	}
	cas := map[string]*x509.CertPool{}
	for _, spec := range ca {
		n, file, err := fileSpec("upstream-ca", spec, ups)
		if err != nil {
			return nil, nil, err
		}
		if offline[n] {
			continue // never asked: no connection to trust
		}
		if cas[n], err = addRootCAs(cas[n], file); err != nil {
			return nil, nil, fmt.Errorf("--upstream-ca %s: %w", n, err)
		}
	}
	return creds, cas, nil
}

// fileSpec splits NAME=FILE of --upstream-auth and --upstream-ca; NAME must be one of ups.
func fileSpec(flag, spec string, ups []name.Upstream) (string, string, error) {
	n, file, ok := strings.Cut(spec, "=")
	if !ok || n == "" || file == "" {
		return "", "", fmt.Errorf("--%s %q: want NAME=FILE, e.g. ghcr.io=/etc/nodecache/config.json", flag, spec)
	}
	reg, err := name.ParseRegistry(n)
	if err != nil {
		return "", "", fmt.Errorf("--%s %q: %w", flag, spec, err)
	}
	var names []string
	for _, u := range ups {
		if u.Name == reg || (name.Canonical(u.Name) == name.DockerHub && name.Canonical(reg) == name.DockerHub) {
			return u.Name, file, nil
		}
		names = append(names, u.Name)
	}
	return "", "", fmt.Errorf("--%s %q: %s is not among the --upstream names %s", flag, spec, reg, strings.Join(names, ", "))
}
