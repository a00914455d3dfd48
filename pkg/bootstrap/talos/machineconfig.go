package talos

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/types/cri"
	resconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	yaml "go.yaml.in/yaml/v4"

	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// ParseMachineConfig reads a node's machine configuration in either form talosctl prints it:
//   - the configuration itself, as `talosctl read /system/state/config.yaml` prints it (a
//     v1alpha1 document and any number of other documents, separated by "---");
//   - the MachineConfig resource, as `talosctl get machineconfig -o yaml` prints it: metadata and
//     a spec that holds the configuration (a YAML string since Talos v1.6, a mapping before).
//     With several resources, the active one (id v1alpha1) is used; the output of several
//     nodes is refused.
//
// The configuration is loaded with machinery's configloader (not validated: a node's running
// config is taken as it is). name names the input in errors. Bad input is refused
// (bootstrap.ErrRefused) saying what is accepted.
func ParseMachineConfig(name string, data []byte) (config.Provider, error) {
	const accepted = "want the output of `talosctl read /system/state/config.yaml` or of `talosctl get machineconfig -o yaml` for one node"
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, refusal.Errorf("%s is empty: %s", name, accepted)
	}
	spec, isResource, err := resourceSpec(data)
	if err != nil {
		return nil, refusal.Errorf("%s: %v: %s", name, err, accepted)
	}
	if isResource {
		data = spec
	}
	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, refusal.Errorf("%s: not a Talos machine config (%v): %s", name, err, accepted)
	}
	return cfg, nil
}

// resourceSpec returns the configuration held by a MachineConfig resource listing, and false
// when data is not one (a document without both metadata and spec).
func resourceSpec(data []byte) ([]byte, bool, error) {
	type resource struct {
		Node     string `yaml:"node"`
		Metadata struct {
			Type string `yaml:"type"`
			ID   string `yaml:"id"`
		} `yaml:"metadata"`
		Spec yaml.Node `yaml:"spec"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var active []resource
	for i := 0; ; i++ {
		var r resource
		err := dec.Decode(&r)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if i == 0 {
				return nil, false, nil // not YAML we can read: configloader says why
			}
			return nil, false, fmt.Errorf("resource %d: %w", i+1, err)
		}
		if r.Metadata.Type == "" || r.Spec.Kind == 0 {
			if i == 0 {
				return nil, false, nil // the configuration itself
			}
			continue
		}
		if !strings.HasPrefix(r.Metadata.Type, resconfig.MachineConfigType) {
			return nil, false, fmt.Errorf("resource of type %q, not %s", r.Metadata.Type, resconfig.MachineConfigType)
		}
		if r.Metadata.ID == resconfig.ActiveID {
			active = append(active, r)
		}
	}
	switch {
	case len(active) == 0:
		return nil, false, fmt.Errorf("no MachineConfig resource with id %s (the configuration the node runs)", resconfig.ActiveID)
	case len(active) > 1:
		var nodes []string
		for _, r := range active {
			nodes = append(nodes, r.Node)
		}
		return nil, false, fmt.Errorf("holds the machine configs of %d nodes (%s): give one node's", len(active), strings.Join(nodes, ", "))
	}
	spec := active[0].Spec
	if spec.Kind == yaml.ScalarNode {
		return []byte(spec.Value), true, nil
	}
	b, err := yaml.Marshal(&spec)
	if err != nil {
		return nil, false, fmt.Errorf("spec: %w", err)
	}
	return b, true, nil
}

// mirrorsUsing lists what the node's configuration cfg holds for the mirror m: the registry
// names whose mirror endpoints include m (any path), in the legacy machine.registries.mirrors
// and as RegistryMirrorConfig documents, and whether a TLS entry for m's host exists in either
// form. others are the other endpoints of those mirrors (reported: the removal deletes the
// whole mirror).
type mirrorsUsing struct {
	legacy, documents []string
	legacyTLS, docTLS bool
	others            []string
}

func findMirrors(cfg config.Provider, m name.Mirror) mirrorsUsing {
	var out mirrorsUsing
	if raw := cfg.RawV1Alpha1(); raw != nil && raw.MachineConfig != nil {
		regs := raw.MachineConfig.MachineRegistries  //nolint:staticcheck // the legacy form is what is being removed
		for name, mc := range regs.RegistryMirrors { // legacy form
			if mc == nil {
				continue
			}
			if hit, rest := matchEndpoints(m, mc.MirrorEndpoints); hit { // legacy form
				out.legacy = append(out.legacy, name)
				for _, r := range rest {
					out.others = append(out.others, name+": "+r)
				}
			}
		}
		_, out.legacyTLS = regs.RegistryConfig[m.Host()] // legacy form
	}
	for _, d := range cfg.Documents() {
		out.addDocument(d, m)
	}
	slices.Sort(out.legacy)
	slices.Sort(out.documents)
	slices.Sort(out.others)
	return out
}

// addDocument records what the document d holds for the mirror m: a RegistryMirrorConfig with
// an endpoint at m, or a RegistryTLSConfig for m's host.
func (out *mirrorsUsing) addDocument(d any, m name.Mirror) {
	switch doc := d.(type) {
	case *cri.RegistryMirrorConfigV1Alpha1:
		var eps []string
		for _, ep := range doc.RegistryEndpoints {
			if ep.EndpointURL.URL != nil {
				eps = append(eps, ep.EndpointURL.URL.String())
			}
		}
		if hit, rest := matchEndpoints(m, eps); hit {
			out.documents = append(out.documents, doc.MetaName)
			for _, r := range rest {
				out.others = append(out.others, doc.MetaName+": "+r)
			}
		}
	case *cri.RegistryTLSConfigV1Alpha1:
		if strings.EqualFold(doc.MetaName, m.Host()) {
			out.docTLS = true
		}
	}
}

// matchEndpoints reports whether one of the endpoints names is at the mirror m (its scheme and
// host, any path), and returns the others.
func matchEndpoints(m name.Mirror, names []string) (bool, []string) {
	var hit bool
	var rest []string
	for _, ep := range names {
		u, err := url.Parse(ep)
		if err == nil && strings.EqualFold(u.Scheme, m.URL.Scheme) && strings.EqualFold(u.Host, m.URL.Host) {
			hit = true
			continue
		}
		rest = append(rest, ep)
	}
	return hit, rest
}
