package runtimetest

import (
	"fmt"
	"runtime"

	"github.com/pelletier/go-toml/v2"
)

// ContainerdConfig says how to configure a test containerd. The zero value gives a daemon whose
// CRI registry config_path is unset, so containerd's own default applies (on 2.x the two-directory
// list /etc/containerd/certs.d:/etc/docker/certs.d).
type ContainerdConfig struct {
	// Dir holds config.toml, root/, state/ and containerd.log; default t.TempDir().
	Dir string
	// Schema is config.toml's `version`; 0 means 3 for containerd 2.x and 2 for 1.x. Containerd
	// 2.3 and later also accept 4; 1.7 refuses anything above 2.
	Schema int
	// ConfigPath, when not empty, is written as the CRI registry `config_path` (a directory of
	// <host>/hosts.toml, or a ":"-separated list) in the table that Schema selects:
	// plugins."io.containerd.cri.v1.images".registry (3, 4) or
	// plugins."io.containerd.grpc.v1.cri".registry (2).
	ConfigPath string
	// Set is deep-merged over the generated document before it is written: nested
	// map[string]any become tables, []map[string]any arrays of tables. Example:
	//   {"plugins": {"io.containerd.cri.v1.images": {"use_local_image_pull": true}}}
	Set map[string]any
	// AppendTOML is raw TOML appended after the generated document, for shapes a test needs
	// byte for byte (legacy `mirrors` tables, comments, quoting styles). It may only add tables
	// the generated document does not have; the result must parse or New fails.
	AppendTOML string
	// LogLevel is containerd's [debug] level; default "debug" (pull attempts and host fallbacks
	// are logged only at debug).
	LogLevel string
}

// Config table names per schema (containerd's plugin IDs).
const (
	tableCRIImages   = "io.containerd.cri.v1.images"     // schema 3 and 4
	tableCRILegacy   = "io.containerd.grpc.v1.cri"       // schema 2 (containerd 1.x)
	tableTransfer    = "io.containerd.transfer.v1.local" // 2.x transfer service
	tableNRI         = "io.containerd.nri.v1.nri"
	tableGRPCServer  = "io.containerd.server.v1.grpc"  // schema 4: the gRPC socket
	tableTTRPCServer = "io.containerd.server.v1.ttrpc" // schema 4: the ttrpc socket
	// schemaServerPlugins is the first schema whose server sockets are plugin tables
	// (containerd 2.3+, cmd/containerd/server/config serviceMigrate).
	schemaServerPlugins = 4
	defaultLogLevel     = "debug"
	snapshotter         = "native" // works on any filesystem, needs no mounts
	socketFileName      = "containerd.sock"
	configFileName      = "config.toml"
	logFileName         = "containerd.log"
	minSchemaForV2      = 3
	legacySchemaV1      = 2
	defaultSchemaV2     = 3
	unixSocketMaxLen    = 107 // sun_path is 108 bytes including the terminating NUL
)

// RegistryTable returns the dotted path of the CRI registry table for a config schema, as a key
// list: ["plugins", "io.containerd.cri.v1.images", "registry"] for 3 and 4,
// ["plugins", "io.containerd.grpc.v1.cri", "registry"] for 2.
func RegistryTable(schema int) []string {
	if schema >= minSchemaForV2 {
		return []string{"plugins", tableCRIImages, "registry"}
	}
	return []string{"plugins", tableCRILegacy, "registry"}
}

// containerdConfigTOML renders config.toml for a daemon of the given major version.
//
// Every path the daemon writes is under dir or sock: root, state, the gRPC socket (the ttrpc one
// is derived from it; schema 4 names both in their server plugin tables). NRI is disabled so that daemons running side by side do not fight over
// /var/run/nri/nri.sock. Images unpack with the native snapshotter; on 2.x the transfer service,
// which CRI pulls go through, also needs an unpack platform, else PullImage fails with
// "no unpack platforms defined".
func containerdConfigTOML(cfg ContainerdConfig, major int, root, state, sock string) ([]byte, int, error) {
	schema := cfg.Schema
	if schema == 0 {
		schema = defaultSchemaV2
		if major < 2 {
			schema = legacySchemaV1
		}
	}
	level := cfg.LogLevel
	if level == "" {
		level = defaultLogLevel
	}
	plugins := map[string]any{
		tableNRI: map[string]any{"disable": true},
	}
	if schema >= minSchemaForV2 {
		plugins[tableCRIImages] = map[string]any{"snapshotter": snapshotter}
		plugins[tableTransfer] = map[string]any{
			"unpack_config": []map[string]any{{
				"platform":    "linux/" + runtime.GOARCH,
				"snapshotter": snapshotter,
			}},
		}
	} else {
		plugins[tableCRILegacy] = map[string]any{
			"containerd": map[string]any{"snapshotter": snapshotter},
		}
	}
	doc := map[string]any{
		"version": schema,
		"root":    root,
		"state":   state,
		"debug":   map[string]any{"level": level},
		"plugins": plugins,
	}
	if schema >= schemaServerPlugins {
		// Schema 4 is not migrated: a top-level [grpc] would be ignored and the servers would
		// listen on /run/containerd/containerd.sock{,.ttrpc}, the host's own daemon's sockets.
		plugins[tableGRPCServer] = map[string]any{"address": sock}
		plugins[tableTTRPCServer] = map[string]any{"address": sock + ".ttrpc"}
	} else {
		doc["grpc"] = map[string]any{"address": sock}
	}
	if cfg.ConfigPath != "" {
		setPath(doc, RegistryTable(schema), "config_path", cfg.ConfigPath)
	}
	mergeTOML(doc, cfg.Set)

	out, err := toml.Marshal(doc)
	if err != nil {
		return nil, 0, fmt.Errorf("encode containerd config: %w", err)
	}
	if cfg.AppendTOML != "" {
		out = append(out, '\n')
		out = append(out, cfg.AppendTOML...)
		if len(cfg.AppendTOML) > 0 && cfg.AppendTOML[len(cfg.AppendTOML)-1] != '\n' {
			out = append(out, '\n')
		}
	}
	var check map[string]any
	if err := toml.Unmarshal(out, &check); err != nil {
		return nil, 0, fmt.Errorf("containerd config with AppendTOML does not parse: %w\n%s", err, out)
	}
	return out, schema, nil
}

// setPath sets doc[path...][key] = value, creating tables on the way.
func setPath(doc map[string]any, path []string, key string, value any) {
	m := doc
	for _, p := range path {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[key] = value
}

// mergeTOML deep-merges src into dst: tables merge key by key, anything else replaces.
func mergeTOML(dst, src map[string]any) {
	for k, v := range src {
		sv, sok := v.(map[string]any)
		dv, dok := dst[k].(map[string]any)
		if sok && dok {
			mergeTOML(dv, sv)
			continue
		}
		dst[k] = v
	}
}
