package activation

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// DetectedVersion is a runtime's release and where it was read.
type DetectedVersion struct {
	bootstrap.Version
	// Raw is the version as the source gave it ("v2.4.2", "1.31.0").
	Raw string
	// Source says where: "version service on <socket>", "CRI version on <socket>", "build
	// information of pid <n>", "build information of <binary>".
	Source string
}

// RuntimeVersion finds the release of the runtime ("containerd" or "crio") from the running
// daemon, never by running a host binary: first its API on socket (a host path: containerd's
// version service, CRI-O's CRI Version), else the Go build information of the daemon's
// executable (/proc/<pid>/exe of the containerd serving socket, or of the one crio process),
// else of the binary in the usual directories under the host root. The error lists what was
// tried.
func RuntimeVersion(ctx context.Context, h *bootstrap.Host, runtime, socket string) (DetectedVersion, error) {
	var tried []string
	if local, err := h.Local(socket); err != nil {
		tried = append(tried, err.Error())
	} else if raw, err := apiVersion(ctx, local, runtime); err != nil {
		tried = append(tried, err.Error())
	} else if v, err := bootstrap.ParseVersion(raw); err != nil {
		tried = append(tried, err.Error())
	} else {
		src := "version service on " + socket
		if runtime == RuntimeCRIO {
			src = "CRI version on " + socket
		}
		return DetectedVersion{Version: v, Raw: raw, Source: src}, nil
	}
	var pid int
	switch runtime {
	case RuntimeContainerd:
		d, err := FindContainerd(h, socket)
		switch {
		case err != nil:
			tried = append(tried, err.Error())
		case d != nil:
			pid = d.PID
		}
	default:
		procs, err := h.Processes("crio")
		switch {
		case err != nil:
			tried = append(tried, err.Error())
		case len(procs) == 1:
			pid = procs[0].PID
		}
	}
	if pid != 0 {
		v, err := bootstrap.BinaryVersion(h.Executable(pid), binaryName(runtime))
		if err == nil {
			return DetectedVersion{Version: v, Raw: v.String(), Source: fmt.Sprintf("build information of pid %d", pid)}, nil
		}
		tried = append(tried, err.Error())
	}
	v, err := bootstrap.ProbeVersion(ctx, h.Root(), binaryName(runtime))
	if err == nil {
		return DetectedVersion{Version: v, Raw: v.String(), Source: "build information of the " + binaryName(runtime) + " binary"}, nil
	}
	tried = append(tried, err.Error())
	return DetectedVersion{}, errors.New(strings.Join(tried, "; "))
}

func binaryName(runtime string) string {
	if runtime == RuntimeCRIO {
		return "crio"
	}
	return "containerd"
}

// apiVersion asks the daemon on the unix socket at local (this process's path).
func apiVersion(ctx context.Context, local, runtime string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultAPITimeout) // a caller's shorter deadline wins
	defer cancel()
	if runtime != RuntimeCRIO {
		c, err := dialContainerd(local)
		if err != nil {
			return "", err
		}
		defer c.Close()
		raw, _, err := c.Version(ctx)
		return raw, err
	}
	conn, err := grpc.NewClient("unix://"+local, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", fmt.Errorf("CRI-O socket %s: %w", local, err)
	}
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", fmt.Errorf("CRI version: %w", err)
	}
	return resp.GetRuntimeVersion(), nil
}

// ContainerdSocket is the socket the containerd configured by config (a host path; "" for
// bcontainerd.DefaultConfig) serves: its grpc address, else containerd's default.
func ContainerdSocket(h *bootstrap.Host, config string) string {
	if config == "" {
		config = bcontainerd.DefaultConfig
	}
	if eff, err := bcontainerd.Load(h.FS(), config, bcontainerd.LoadOptions{}); err == nil && eff.GRPCAddress != "" {
		return eff.GRPCAddress
	}
	return bcontainerd.DefaultSocket
}
