// Package talos builds the Talos machine-config patch that points a node's image pulls at a
// nodecache mirror, from Talos machinery's own types, encoded with machinery's encoder.
//
// Talos >= v1.12 gets one RegistryMirrorConfig document per upstream (plus a RegistryTLSConfig
// for an https mirror with a CA); Talos <= v1.11 rejects that kind and gets the legacy
// machine.registries.mirrors patch instead. Talos applies mirror changes live (it writes
// /etc/cri/conf.d/hosts/<registry>/hosts.toml), so no reboot is needed.
package talos

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/cri"
	"github.com/siderolabs/talos/pkg/machinery/config/types/meta"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	talosversion "github.com/siderolabs/talos/pkg/machinery/version"
	yaml "go.yaml.in/yaml/v4"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Form is the shape of the patch.
type Form string

// Forms.
const (
	// FormDocuments: RegistryMirrorConfig (and RegistryTLSConfig) documents, Talos >= v1.12.
	FormDocuments Form = "documents"
	// FormLegacy: a v1alpha1 patch of machine.registries, Talos <= v1.11.
	FormLegacy Form = "machine.registries"
)

// Feature floors of the legacy form (Talos release notes of v1.3 and v1.9; the fields are
// machine.registries.mirrors.<host>.overridePath and .skipFallback of Talos' v1alpha1
// configuration reference).
var (
	overridePathSince = config.TalosVersion1_3 // mirrors.<host>.overridePath
	skipFallbackSince = config.TalosVersion1_9 // mirrors.<host>.skipFallback
)

// DefaultVersion is the Talos release machinery was built for (the default --talos-version).
func DefaultVersion() string { return strings.TrimSpace(talosversion.Tag) }

// Options configure Generate.
type Options struct {
	// Mirror is the nodecache endpoint (required).
	Mirror name.Mirror
	// Upstreams are the registry names to mirror (required).
	Upstreams []string
	// Fallbacks maps an upstream NAME to its own registry URL when that is not https://NAME
	// (bootstrap.Fallbacks, from --upstream NAME=http://NAME): written as a second endpoint after
	// the mirror, so an http-only registry stays reachable when the mirror is down.
	Fallbacks map[string]string
	// TalosVersion is the target release, "vX.Y.Z" (default DefaultVersion()).
	TalosVersion string
	// SkipFallback stops pulls from falling back to the real registry when the mirror fails.
	// Refused below v1.9 and with a loopback mirror (the node could not pull the agent's own
	// image).
	SkipFallback bool
	// PathPrefix writes the endpoint <mirror>/v2/<NAME> with overridePath instead of relying on
	// ?ns= routing (refused below v1.3).
	PathPrefix bool
	// MirrorCA is a PEM CA certificate for an https mirror (refused for http: kubelet pulls
	// then fail). MirrorCAName names its source in messages.
	MirrorCA     []byte
	MirrorCAName string
	// Remove produces the patch that deletes what Generate adds ($patch: delete).
	Remove bool
	// MachineConfig is the node's current configuration (ParseMachineConfig; --machine-config)
	// for Remove: the patch then deletes exactly the mirrors whose endpoints include Mirror (in
	// the form each has there, whatever upstream list added them) and Mirror's TLS entry, and
	// nothing that does not exist. Without it, Remove deletes the Upstreams list, which must
	// then be the list used to add.
	MachineConfig config.Provider
}

// Result is the generated patch and what it is for.
type Result struct {
	Runtime      string   `json:"runtime"`
	TalosVersion string   `json:"talos_version"`
	Form         Form     `json:"form"`
	Mirror       string   `json:"mirror"`
	Upstreams    []string `json:"upstreams"`
	Remove       bool     `json:"remove,omitempty"`
	// Warnings say what a removal from a machine config also takes away (other endpoints of a
	// deleted mirror).
	Warnings []string `json:"warnings,omitempty"`
	// Patch is the YAML patch (documents joined with "---"), starting with mirrorapi.ManagedMarker;
	// empty when NothingToRemove is set.
	Patch string `json:"patch"`
	// NothingToRemove says why a removal has nothing to take out (the machine config lists no
	// mirror at Mirror): done already, like gen containerd --remove on a clean host; no patch.
	NothingToRemove string `json:"nothing_to_remove,omitempty"`
}

// Generate builds the patch. Bad combinations are refused (bootstrap.ErrRefused) with the reason.
func Generate(opts Options) (*Result, error) {
	if opts.TalosVersion == "" {
		opts.TalosVersion = DefaultVersion()
	}
	contract, err := checkOptions(opts)
	if err != nil {
		return nil, err
	}
	res := &Result{Runtime: "talos", TalosVersion: opts.TalosVersion, Upstreams: opts.Upstreams, Remove: opts.Remove}
	if opts.Mirror.URL != nil {
		res.Mirror = opts.Mirror.String()
	}
	legacy := !contract.Greater(config.TalosVersion1_11)
	res.Form = FormDocuments
	if legacy {
		res.Form = FormLegacy
	}
	if !opts.Remove {
		if err := check(opts, contract); err != nil {
			return nil, err
		}
	}
	var body []byte
	switch {
	case opts.Remove && opts.MachineConfig != nil:
		var done bool
		if body, done, err = removalFromMachineConfig(opts, res); done {
			return res, nil
		}
	case opts.Remove && legacy:
		body, err = legacyRemoval(opts)
	case opts.Remove:
		body, err = documentsRemoval(opts)
	case legacy:
		body, err = legacyPatch(opts)
	default:
		body, err = documentsPatch(opts)
	}
	if err != nil {
		return nil, err
	}
	res.Patch = mirrorapi.ManagedMarker + "\n" + string(body)
	return res, nil
}

// checkOptions refuses an unknown Talos version and missing flags, and returns the version's
// contract.
func checkOptions(opts Options) (*config.VersionContract, error) {
	contract, err := config.ParseContractFromVersion(opts.TalosVersion)
	if err != nil {
		return nil, refusal.Errorf("--talos-version %q: want vX.Y.Z, e.g. %s", opts.TalosVersion, DefaultVersion())
	}
	if contract.Major != 1 {
		return nil, refusal.Errorf("--talos-version %q: only Talos v1.x is known", opts.TalosVersion)
	}
	if opts.Mirror.URL == nil && !opts.Remove {
		return nil, refusal.Errorf("--mirror is required")
	}
	if len(opts.Upstreams) == 0 && opts.MachineConfig == nil {
		return nil, refusal.Errorf("at least one --upstream is required")
	}
	for _, n := range opts.Upstreams {
		if err := bootstrap.CheckName(n); err != nil {
			return nil, err
		}
	}
	return contract, nil
}

// removalFromMachineConfig is the removal patch for the mirrors the node's machine config lists
// with an endpoint at the mirror, in the form they are written in; res gets their registries and
// warnings. done: there is nothing to remove (res.NothingToRemove says so), and no patch.
func removalFromMachineConfig(opts Options, res *Result) (body []byte, done bool, err error) {
	if opts.Mirror.URL == nil {
		return nil, false, refusal.Errorf("--machine-config needs --mirror: the removal deletes the mirrors whose endpoints include it")
	}
	found := findMirrors(opts.MachineConfig, opts.Mirror)
	res.Upstreams = append(slices.Clone(found.legacy), found.documents...)
	slices.Sort(res.Upstreams)
	res.Upstreams = slices.Compact(res.Upstreams)
	switch {
	case len(found.documents) > 0 && len(found.legacy) == 0:
		res.Form = FormDocuments
	case len(found.legacy) > 0 && len(found.documents) == 0:
		res.Form = FormLegacy
	}
	if len(res.Upstreams) == 0 && !found.legacyTLS && !found.docTLS {
		res.NothingToRemove = fmt.Sprintf("the machine config lists no mirror with an endpoint at %s", opts.Mirror)
		return nil, true, nil
	}
	for _, o := range found.others {
		res.Warnings = append(res.Warnings, fmt.Sprintf("the mirror of %s also lists it; the removal deletes the whole mirror: add it again if the node still needs it", o))
	}
	body, err = removalFrom(found, opts.Mirror)
	return body, false, err
}

func check(opts Options, contract *config.VersionContract) error {
	if opts.SkipFallback {
		if !contract.Greater(skipFallbackSince) && !equal(contract, skipFallbackSince) {
			return refusal.Errorf("--skip-fallback needs Talos >= %s (target %s)", skipFallbackSince, opts.TalosVersion)
		}
		if opts.Mirror.Loopback() {
			return refusal.Errorf("--skip-fallback with the loopback mirror %s is refused: when the node's own agent is down the node could not pull even the agent's image", opts.Mirror)
		}
	}
	if opts.PathPrefix && !contract.Greater(overridePathSince) && !equal(contract, overridePathSince) {
		return refusal.Errorf("--path-prefix needs Talos >= %s (overridePath; target %s)", overridePathSince, opts.TalosVersion)
	}
	if len(opts.MirrorCA) > 0 {
		if opts.Mirror.HTTP() {
			return refusal.Errorf("--mirror-ca is for an https mirror; %s is http (a TLS config for an http endpoint makes kubelet pulls fail)", opts.Mirror)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(opts.MirrorCA) {
			return refusal.Errorf("--mirror-ca %s: no PEM certificate in it", opts.MirrorCAName)
		}
	}
	return nil
}

func equal(a, b *config.VersionContract) bool { return a.Major == b.Major && a.Minor == b.Minor }

// endpoint returns the mirror endpoint for an upstream and whether it carries its own API path.
func endpoint(opts Options, name string) (*url.URL, bool) {
	u := *opts.Mirror.URL
	if opts.PathPrefix {
		u.Path = "/v2/" + name
		return &u, true
	}
	return &u, false
}

// fallback is the endpoint written after the mirror for an upstream whose own registry is not
// https://NAME (Options.Fallbacks), or nil.
func fallback(opts Options, name string) (*url.URL, error) {
	fb, ok := opts.Fallbacks[name]
	if !ok {
		return nil, nil
	}
	u, err := url.Parse(fb)
	if err != nil || u.Host == "" {
		return nil, refusal.Errorf("--upstream %s=%s: not a registry URL", name, fb)
	}
	return u, nil
}

// documentsPatch: one RegistryMirrorConfig per upstream, then the mirror's RegistryTLSConfig.
func documentsPatch(opts Options) ([]byte, error) {
	var docs []any
	for _, n := range opts.Upstreams {
		doc := cri.NewRegistryMirrorConfigV1Alpha1(n)
		u, override := endpoint(opts, n)
		ep := cri.RegistryEndpoint{EndpointURL: meta.URL{URL: u}}
		if override {
			ep.EndpointOverridePath = new(true)
		}
		doc.RegistryEndpoints = []cri.RegistryEndpoint{ep}
		if fb, err := fallback(opts, n); err != nil {
			return nil, err
		} else if fb != nil {
			doc.RegistryEndpoints = append(doc.RegistryEndpoints, cri.RegistryEndpoint{EndpointURL: meta.URL{URL: fb}})
		}
		if opts.SkipFallback {
			doc.RegistrySkipFallback = new(true)
		}
		docs = append(docs, doc)
	}
	if len(opts.MirrorCA) > 0 {
		tls := cri.NewRegistryTLSConfigV1Alpha1(opts.Mirror.Host())
		tls.TLSCA = string(opts.MirrorCA)
		docs = append(docs, tls)
	}
	return encodeAll(docs)
}

// legacyPatch: a v1alpha1 document with machine.registries.mirrors (and .config for the CA).
func legacyPatch(opts Options) ([]byte, error) {
	regs := v1alpha1.RegistriesConfig{RegistryMirrors: map[string]*v1alpha1.RegistryMirrorConfig{}} // the only form Talos <= v1.11 accepts
	for _, n := range opts.Upstreams {
		u, override := endpoint(opts, n)
		m := &v1alpha1.RegistryMirrorConfig{MirrorEndpoints: []string{u.String()}} // legacy form
		fb, err := fallback(opts, n)
		if err != nil {
			return nil, err
		}
		if fb != nil {
			m.MirrorEndpoints = append(m.MirrorEndpoints, fb.String()) // legacy form
		}
		if override {
			m.MirrorOverridePath = new(true)
		}
		if opts.SkipFallback {
			m.MirrorSkipFallback = new(true)
		}
		regs.RegistryMirrors[n] = m // legacy form
	}
	if len(opts.MirrorCA) > 0 {
		regs.RegistryConfig = map[string]*v1alpha1.RegistryConfig{ // legacy form
			opts.Mirror.Host(): {RegistryTLS: &v1alpha1.RegistryTLSConfig{TLSCA: v1alpha1.Base64Bytes(opts.MirrorCA)}},
		}
	}
	// machinery's encoder renders the typed registries; the v1alpha1 envelope around them stays
	// minimal (a whole v1alpha1.Config would also carry machine.type, token, certSANs and
	// cluster: null, which a patch must not set).
	regsNode, err := encoder.NewEncoder(regs, encoder.WithComments(encoder.CommentsDisabled)).Marshal()
	if err != nil {
		return nil, fmt.Errorf("encode machine.registries: %w", err)
	}
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		scalar("version"), scalar("v1alpha1"),
		scalar("machine"), {Kind: yaml.MappingNode, Content: []*yaml.Node{scalar("registries"), regsNode}},
	}}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(4)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encode legacy patch: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode legacy patch: %w", err)
	}
	return out.Bytes(), nil
}

func scalar(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: s} }

func encodeAll(docs []any) ([]byte, error) {
	var out bytes.Buffer
	for i, d := range docs {
		b, err := encoder.NewEncoder(d, encoder.WithComments(encoder.CommentsDisabled)).Encode()
		if err != nil {
			return nil, fmt.Errorf("encode Talos patch document %d: %w", i, err)
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(b)
	}
	return out.Bytes(), nil
}

// deleteDoc is a document-level strategic-merge deletion ($patch: delete) of a named document.
type deleteDoc struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Name       string `yaml:"name"`
	Patch      string `yaml:"$patch"`
}

// removalFrom deletes what findMirrors found in a node's config: the legacy entries in one
// v1alpha1 patch, then one deletion per document. Nothing that is not in the config is named
// (configpatcher would append a deletion of a missing document to the config, and machinery's
// encoder then fails on it).
func removalFrom(found mirrorsUsing, m name.Mirror) ([]byte, error) {
	var parts [][]byte
	if len(found.legacy) > 0 || found.legacyTLS {
		del := map[string]string{"$patch": "delete"}
		regs := map[string]any{}
		if len(found.legacy) > 0 {
			mirrors := map[string]any{}
			for _, n := range found.legacy {
				mirrors[n] = del
			}
			regs["mirrors"] = mirrors
		}
		if found.legacyTLS {
			regs["config"] = map[string]any{m.Host(): del}
		}
		b, err := yaml.Marshal(map[string]any{"version": "v1alpha1", "machine": map[string]any{"registries": regs}})
		if err != nil {
			return nil, fmt.Errorf("encode legacy removal patch: %w", err)
		}
		parts = append(parts, b)
	}
	var docs []deleteDoc
	for _, n := range found.documents {
		docs = append(docs, deleteDoc{APIVersion: "v1alpha1", Kind: cri.RegistryMirrorConfig, Name: n, Patch: "delete"})
	}
	if found.docTLS {
		docs = append(docs, deleteDoc{APIVersion: "v1alpha1", Kind: cri.RegistryTLSConfig, Name: m.Host(), Patch: "delete"})
	}
	for _, d := range docs {
		b, err := yaml.Marshal(d)
		if err != nil {
			return nil, fmt.Errorf("encode removal of %s %s: %w", d.Kind, d.Name, err)
		}
		parts = append(parts, b)
	}
	return bytes.Join(parts, []byte("---\n")), nil
}

// documentsRemoval deletes the RegistryMirrorConfig of every upstream (and the mirror's
// RegistryTLSConfig when a CA was given).
func documentsRemoval(opts Options) ([]byte, error) {
	var out bytes.Buffer
	write := func(d deleteDoc) error {
		if out.Len() > 0 {
			out.WriteString("---\n")
		}
		b, err := yaml.Marshal(d)
		if err != nil {
			return fmt.Errorf("encode removal of %s %s: %w", d.Kind, d.Name, err)
		}
		out.Write(b)
		return nil
	}
	for _, n := range opts.Upstreams {
		if err := write(deleteDoc{APIVersion: "v1alpha1", Kind: cri.RegistryMirrorConfig, Name: n, Patch: "delete"}); err != nil {
			return nil, err
		}
	}
	if len(opts.MirrorCA) > 0 && opts.Mirror.URL != nil {
		if err := write(deleteDoc{APIVersion: "v1alpha1", Kind: cri.RegistryTLSConfig, Name: opts.Mirror.Host(), Patch: "delete"}); err != nil {
			return nil, err
		}
	}
	return out.Bytes(), nil
}

// legacyRemoval deletes machine.registries.mirrors.<NAME> for every upstream (and the mirror's
// machine.registries.config entry when a CA was given).
func legacyRemoval(opts Options) ([]byte, error) {
	del := map[string]string{"$patch": "delete"}
	mirrors := map[string]any{}
	for _, n := range opts.Upstreams {
		mirrors[n] = del
	}
	regs := map[string]any{"mirrors": mirrors}
	if len(opts.MirrorCA) > 0 && opts.Mirror.URL != nil {
		regs["config"] = map[string]any{opts.Mirror.Host(): del}
	}
	doc := map[string]any{"version": "v1alpha1", "machine": map[string]any{"registries": regs}}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode legacy removal patch: %w", err)
	}
	return b, nil
}
