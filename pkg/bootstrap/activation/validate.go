package activation

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Flags are the evidence flags status and agent share, as given on the command line.
type Flags struct {
	// Runtime is --runtime: auto, containerd, crio or talos.
	Runtime string
	// HostRoot is --host-root, the directory the host's / is mounted at.
	HostRoot string
	// ContainerdConfig and ContainerdSocket are --containerd-config and --containerd-socket:
	// absolute host paths, or empty for the defaults.
	ContainerdConfig, ContainerdSocket string
	// Upstreams are status' --upstream values, NAME or NAME=URL as gen takes them (only NAME is
	// used): the registries that must go through the mirror (Options.Upstreams). Empty: the
	// default of Options.Upstreams.
	Upstreams []string
}

// Options checks f and returns the Options it gives, with the host view built
// (bootstrap.NewHost). Every problem is reported: the error is one refusal (refusal.ErrRefused)
// of the problems joined, each naming its flag and what it accepts.
func (f Flags) Options() (Options, error) {
	o := Options{Runtime: f.Runtime, ContainerdConfig: f.ContainerdConfig, ContainerdSocket: f.ContainerdSocket}
	var errs []error
	switch o.Runtime {
	case RuntimeAuto, RuntimeContainerd, RuntimeCRIO, RuntimeTalos:
	default:
		errs = append(errs, fmt.Errorf("--runtime %q: want auto, containerd, crio or talos", o.Runtime))
	}
	if f.HostRoot == "" {
		errs = append(errs, errors.New("--host-root is empty: want the directory the host's / is mounted at, such as / or /host"))
	} else if h, err := bootstrap.NewHost(bootstrap.HostOptions{Root: f.HostRoot}); err != nil {
		errs = append(errs, err)
	} else {
		o.Host = h
	}
	for _, c := range []struct{ flag, value string }{{"--containerd-config", o.ContainerdConfig}, {"--containerd-socket", o.ContainerdSocket}} {
		if c.value != "" && !filepath.IsAbs(c.value) {
			errs = append(errs, fmt.Errorf("%s %q: want an absolute host path (read under --host-root)", c.flag, c.value))
		}
	}
	if len(f.Upstreams) > 0 {
		ups, err := name.ParseUpstreams(f.Upstreams)
		if err != nil {
			errs = append(errs, fmt.Errorf("--upstream: %w", err))
		}
		for _, u := range ups {
			o.Upstreams = append(o.Upstreams, u.Name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return o, &refusal.Error{Reason: err.Error(), Err: err}
	}
	return o, nil
}
