package talos_test

import (
	"errors"
	"strings"
	"testing"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	yaml "go.yaml.in/yaml/v4"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
)

// Machine configs a node may run, by hand in the shapes nodecache meets: the legacy
// machine.registries form (Talos <= v1.11) and the documents form (>= v1.12), each with the
// mirror at http://10.0.0.5:5000 next to a site mirror of its own.
const (
	fuzzLegacyConfig = `version: v1alpha1
machine:
  type: worker
  install:
    image: ghcr.io/siderolabs/installer:v1.11.5
  registries:
    mirrors:
      docker.io:
        endpoints:
          - http://10.0.0.5:5000
          - https://registry-1.docker.io
      registry.site.lan:
        endpoints:
          - https://mirror-a.site.lan
    config:
      10.0.0.5:5000:
        tls:
          insecureSkipVerify: true
cluster:
  controlPlane:
    endpoint: https://10.5.0.2:6443
`
	fuzzDocumentsConfig = `version: v1alpha1
machine:
  type: controlplane
  install:
    image: ghcr.io/siderolabs/installer:v1.13.0
  kubelet:
    image: ghcr.io/siderolabs/kubelet:v1.35.2
cluster:
  controlPlane:
    endpoint: https://10.5.0.2:6443
  proxy:
    disabled: true
---
apiVersion: v1alpha1
kind: RegistryMirrorConfig
name: docker.io
endpoints:
  - url: http://10.0.0.5:5000
  - url: https://registry-1.docker.io
---
apiVersion: v1alpha1
kind: RegistryMirrorConfig
name: registry.site.lan
endpoints:
  - url: https://mirror-a.site.lan
---
apiVersion: v1alpha1
kind: RegistryTLSConfig
name: 10.0.0.5:5000
insecureSkipVerify: true
`
)

// asResourceMapping wraps cfg (one YAML mapping) the way talosctl printed a MachineConfig
// resource before Talos v1.6: the spec a mapping, not a string.
func asResourceMapping(cfg []byte) []byte {
	return underHead("node: 10.5.0.3\nmetadata:\n    namespace: config\n    type: MachineConfigs.config.talos.dev\n    id: v1alpha1\nspec:\n", cfg)
}

// FuzzParseMachineConfig: `gen talos --remove --machine-config` and `warm --machine-config`
// read a node's machine config in either form talosctl prints (the config, or the MachineConfig
// resource); any bytes are refused (bootstrap.ErrRefused, with a message) or read, never a
// panic. A config read gives a removal that is refused or that, applied with Talos'
// configpatcher as the node applies it, leaves nothing of the mirror to remove.
func FuzzParseMachineConfig(f *testing.F) {
	for _, c := range []string{fuzzLegacyConfig, fuzzDocumentsConfig} {
		f.Add([]byte(c))
		f.Add(asResource([]byte(c)))
	}
	f.Add(asResourceMapping([]byte(fuzzLegacyConfig)))
	for _, v := range []string{"v1.11.5", "v1.13.0"} {
		generated := workerConfig(f, v) // about a second: machinery generates the cluster's keys
		f.Add(generated)
		f.Add(asResource(generated))
	}
	f.Add([]byte("metadata:\n  type: Services.v1alpha1.talos.dev\n  id: kubelet\nspec:\n  running: true\n"))
	f.Add([]byte("metadata:\n  type: MachineConfigs.config.talos.dev\n  id: v1alpha1\nspec: 5\n---\nmetadata: {type: MachineConfigs.config.talos.dev, id: v1alpha1}\nspec: ''\n"))
	f.Add([]byte("---\n---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
		cfg, err := talos.ParseMachineConfig("node.yaml", data)
		if err != nil {
			checkRefusal(t, "ParseMachineConfig", err)
			return
		}
		res, err := talos.Generate(talos.Options{Mirror: m, Remove: true, MachineConfig: cfg})
		if err != nil {
			checkRefusal(t, "Generate --remove", err)
			return
		}
		if res.NothingToRemove != "" {
			if res.Patch != "" {
				t.Fatalf("nothing to remove, but a patch:\n%s", res.Patch)
			}
			return
		}
		if _, err := configpatcher.Apply(configpatcher.WithConfig(cfg), nil); err != nil {
			return // the node's config itself does not go through configpatcher
		}
		patch, err := configpatcher.LoadPatch([]byte(res.Patch))
		if err != nil {
			t.Fatalf("the removal does not load as a patch: %v\n%s", err, res.Patch)
		}
		out, err := configpatcher.Apply(configpatcher.WithConfig(cfg), []configpatcher.Patch{patch})
		if err != nil {
			t.Fatalf("the removal does not apply to the config it was made from: %v\n%s", err, res.Patch)
		}
		after, err := out.Config()
		if err != nil {
			t.Fatalf("the config with the removal applied does not load: %v", err)
		}
		again, err := talos.Generate(talos.Options{Mirror: m, Remove: true, MachineConfig: after})
		if err != nil || again.NothingToRemove == "" {
			t.Fatalf("after the removal: %v, %+v; want nothing left to remove\nremoval:\n%s", err, again, res.Patch)
		}
	})
}

// FuzzMachineConfigResource: a machine config printed as a MachineConfig resource (by
// `talosctl get machineconfig -o yaml`, the spec a string since Talos v1.6, a mapping before)
// reads exactly as the config it holds: both refused, or the same configuration.
func FuzzMachineConfigResource(f *testing.F) {
	for _, c := range []string{fuzzLegacyConfig, fuzzDocumentsConfig} {
		f.Add([]byte(c), false)
	}
	f.Add([]byte(fuzzLegacyConfig), true)
	f.Add(workerConfig(f, "v1.13.0"), false)
	f.Add([]byte("version: v1alpha1\n"), true)
	f.Fuzz(func(t *testing.T, cfg []byte, mapping bool) {
		if len(strings.TrimSpace(string(cfg))) == 0 {
			return
		}
		var wrapped []byte
		if mapping {
			var doc map[string]any
			if yaml.Unmarshal(cfg, &doc) != nil || len(doc) == 0 || strings.Contains(string(cfg), "\n---") {
				return // the mapping form holds one document
			}
			wrapped = asResourceMapping(cfg)
		} else {
			wrapped = asResource(cfg)
		}
		direct, derr := talos.ParseMachineConfig("node.yaml", cfg)
		viaResource, rerr := talos.ParseMachineConfig("node.yaml", wrapped)
		if rerr != nil {
			checkRefusal(t, "ParseMachineConfig (resource)", rerr)
		}
		if derr != nil {
			checkRefusal(t, "ParseMachineConfig", derr)
		}
		if (derr == nil) != (rerr == nil) {
			t.Fatalf("the config reads with error %v, the same config as a resource with %v\n%s", derr, rerr, wrapped)
		}
		if derr != nil {
			return
		}
		if a, b := encode(t, direct), encode(t, viaResource); a != b {
			t.Fatalf("the config and the resource holding it read differently:\n%s\n---- via the resource:\n%s", a, b)
		}
	})
}

func encode(t *testing.T, cfg talosconfig.Provider) string {
	t.Helper()
	b, err := cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return "encode: " + err.Error()
	}
	return string(b)
}

// checkRefusal: bad input is refused (bootstrap.ErrRefused) with a message.
func checkRefusal(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, bootstrap.ErrRefused) || strings.TrimSpace(err.Error()) == "" {
		t.Fatalf("%s: %v (%T), want a refusal with a message", what, err, err)
	}
}
