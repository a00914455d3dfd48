package talos_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
)

// sitePatches are a site's own mirrors, in the form each release takes.
var sitePatches = map[string]string{
	"v1.11.5": "machine:\n  registries:\n    mirrors:\n      registry.site.lan:\n        endpoints:\n          - https://mirror-a.site.lan\n          - https://mirror-b.site.lan\n",
	"v1.13.0": "apiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: registry.site.lan\nendpoints:\n  - url: https://mirror-a.site.lan\n  - url: https://mirror-b.site.lan\n",
}

// endpointsOf is every mirror of cfg with its endpoints.
func endpointsOf(cfg talosconfig.Provider) map[string][]string {
	out := map[string][]string{}
	for name, m := range cfg.RegistryMirrorConfigs() {
		for _, ep := range m.Endpoints() {
			out[name] = append(out[name], ep.Endpoint())
		}
	}
	return out
}

// asResource wraps a machine config the way `talosctl get machineconfig -o yaml` prints it.
func asResource(cfg []byte) []byte {
	return underHead("node: 10.5.0.3\nmetadata:\n    namespace: config\n    type: MachineConfigs.config.talos.dev\n    id: v1alpha1\n    version: 4\n    owner:\n    phase: running\n    created: 2026-11-30T10:00:00Z\n    updated: 2026-11-30T11:00:00Z\n    annotations:\n        talos.dev/yaml-spec: \"1\"\nspec: |\n", cfg)
}

// underHead is head followed by every line of cfg indented by four spaces: cfg as the spec of
// a resource whose head ends in "spec:" (a mapping) or "spec: |" (a string). Lines end where
// YAML ends them (YAML 1.2, 5.4 "Line Break Characters": CR LF, CR or LF), so a lone CR starts
// a line that is indented too (FuzzMachineConfigResource found " \r        - https://…", read
// as two lines by the config parser, wrapped as one).
func underHead(head string, cfg []byte) []byte {
	var b strings.Builder
	b.WriteString(head)
	for _, l := range yamlLines(string(cfg)) {
		b.WriteString("    " + l)
	}
	return []byte(b.String())
}

// yamlLines splits s after each YAML line break (CR LF, CR, LF), keeping the breaks.
func yamlLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			return append(out, s)
		}
		end := i + 1
		if s[i] == '\r' && end < len(s) && s[end] == '\n' {
			end++
		}
		out, s = append(out, s[:end]), s[end:]
	}
	return out
}

// TestRemovalFromMachineConfig: an add patch made with one upstream list, then a removal made with
// --machine-config from the patched config (and another --upstream list, which it ignores),
// applied in order with configpatcher to a generated worker config for v1.11 and v1.13, reloaded
// and validated strictly: no nodecache mirror left, the site's mirrors untouched, no panic
// (issue 11). The add patch's http fallback for an http-only registry is checked on the way.
func TestRemovalFromMachineConfig(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	fb, err := bootstrap.Fallbacks([]string{"registry.lan:5000=http://registry.lan:5000"})
	if err != nil {
		t.Fatal(err)
	}
	for _, version := range []string{"v1.11.5", "v1.13.0"} {
		for _, form := range []string{"config", "resource"} {
			t.Run(version+"/"+form, func(t *testing.T) {
				t.Parallel()
				base := workerConfig(t, version)
				site := sitePatches[version]
				add, err := talos.Generate(talos.Options{Mirror: m, TalosVersion: version, Fallbacks: fb,
					Upstreams: []string{"docker.io", "gcr.io", "registry.lan:5000"}})
				if err != nil {
					t.Fatal(err)
				}
				patched := applyLikeANode(t, base, site, add.Patch)
				got := endpointsOf(patched)
				if want := []string{"http://10.0.0.5:5000", "http://registry.lan:5000"}; !slices.Equal(got["registry.lan:5000"], want) {
					t.Fatalf("registry.lan:5000 endpoints %v, want %v (the mirror, then the registry's own http)", got["registry.lan:5000"], want)
				}
				if !slices.Equal(got["docker.io"], []string{"http://10.0.0.5:5000"}) {
					t.Fatalf("docker.io endpoints %v", got["docker.io"])
				}
				nodeCfg, err := patched.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
				if err != nil {
					t.Fatal(err)
				}
				if form == "resource" {
					nodeCfg = asResource(nodeCfg)
				}
				parsed, err := talos.ParseMachineConfig("node.yaml", nodeCfg)
				if err != nil {
					t.Fatal(err)
				}
				rm, err := talos.Generate(talos.Options{Mirror: m, TalosVersion: version, Remove: true, MachineConfig: parsed,
					Upstreams: []string{"quay.io"}})
				if err != nil {
					t.Fatal(err)
				}
				if want := []string{"docker.io", "gcr.io", "registry.lan:5000"}; !slices.Equal(rm.Upstreams, want) {
					t.Fatalf("removal names %v, want %v", rm.Upstreams, want)
				}
				if strings.Contains(rm.Patch, "quay.io") || strings.Contains(rm.Patch, "registry.site.lan") {
					t.Fatalf("removal names what the node does not have or the site's own:\n%s", rm.Patch)
				}
				after := endpointsOf(applyLikeANode(t, base, site, add.Patch, rm.Patch))
				siteOnly := endpointsOf(applyLikeANode(t, base, site))
				if !maps.EqualFunc(after, siteOnly, slices.Equal) {
					t.Fatalf("after removal %v, want the site's own %v", after, siteOnly)
				}
				if len(siteOnly["registry.site.lan"]) != 2 {
					t.Fatalf("site mirrors %v", siteOnly)
				}
			})
		}
	}
}

// TestRemovalFromMachineConfigRefusals: bad --machine-config input is refused with what is
// accepted; a config without the mirror has nothing to remove (no patch, no refusal: newuser2
// item 6, as gen containerd --remove on a clean host).
func TestRemovalFromMachineConfigRefusals(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	base := workerConfig(t, "v1.13.0")
	twoNodes := append(append(asResource(base), "---\n"...), strings.Replace(string(asResource(base)), "10.5.0.3", "10.5.0.4", 1)...)
	for name, tc := range map[string]struct {
		in   []byte
		want string
	}{
		"empty":      {nil, "is empty"},
		"not config": {[]byte("hello: world\n"), "not a Talos machine config"},
		"two nodes":  {twoNodes, "10.5.0.3, 10.5.0.4"},
		"other kind": {[]byte("metadata:\n  type: Services.v1alpha1.talos.dev\n  id: kubelet\nspec:\n  running: true\n"), "not MachineConfigs"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := talos.ParseMachineConfig("node.yaml", tc.in)
			if err == nil {
				_, err = talos.Generate(talos.Options{Mirror: m, Remove: true, MachineConfig: cfg})
			}
			if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a refusal with %q", err, tc.want)
			}
		})
	}
	t.Run("not applied", func(t *testing.T) {
		t.Parallel()
		cfg, err := talos.ParseMachineConfig("node.yaml", asResource(base))
		if err != nil {
			t.Fatal(err)
		}
		res, err := talos.Generate(talos.Options{Mirror: m, Remove: true, MachineConfig: cfg})
		if err != nil || res.Patch != "" || res.NothingToRemove != "the machine config lists no mirror with an endpoint at http://10.0.0.5:5000" {
			t.Fatalf("err %v, result %+v; want nothing to remove and no patch", err, res)
		}
	})
}
