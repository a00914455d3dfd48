package talos_test

import (
	"errors"
	"strings"
	"testing"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"github.com/siderolabs/talos/pkg/machinery/constants"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// metal is the runtime mode of an installed bare-metal node (Talos' internal runtime.ModeMetal).
type metal struct{}

func (metal) String() string        { return "metal" }
func (metal) RequiresInstall() bool { return true }
func (metal) InContainer() bool     { return false }

// workerConfig generates a worker machine config with machinery for a Talos release's contract.
func workerConfig(t testing.TB, version string) []byte {
	t.Helper()
	contract, err := talosconfig.ParseContractFromVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	in, err := generate.NewInput("nodecache-test", "https://10.5.0.2:6443", constants.DefaultKubernetesVersion,
		generate.WithVersionContract(contract), generate.WithInstallDisk("/dev/sda"))
	if err != nil {
		t.Fatalf("generate.NewInput(%s): %v", version, err)
	}
	cfg, err := in.Config(machine.TypeWorker)
	if err != nil {
		t.Fatalf("worker config %s: %v", version, err)
	}
	b, err := cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// applyLikeANode applies the patches with configpatcher, reloads with configloader and validates
// strictly in metal mode, as a node does with its machine config.
func applyLikeANode(t *testing.T, base []byte, patches ...string) talosconfig.Provider {
	t.Helper()
	var ps []configpatcher.Patch
	for _, p := range patches {
		patch, err := configpatcher.LoadPatch([]byte(p))
		if err != nil {
			t.Fatalf("LoadPatch: %v\n%s", err, p)
		}
		ps = append(ps, patch)
	}
	out, err := configpatcher.Apply(configpatcher.WithBytes(base), ps)
	if err != nil {
		t.Fatalf("configpatcher.Apply: %v", err)
	}
	b, err := out.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configloader.NewFromBytes(b)
	if err != nil {
		t.Fatalf("configloader: %v\n%s", err, b)
	}
	if _, err := cfg.Validate(metal{}, validationStrict()...); err != nil {
		t.Fatalf("Validate (strict, metal): %v", err)
	}
	return cfg
}

func TestPatchValidatesLikeANode(t *testing.T) {
	t.Parallel()
	ca := bootstraptest.CA(t)
	upstreams := []string{"docker.io", "ghcr.io", "registry.k8s.io", "localhost:5001"}
	cases := []struct {
		name         string
		version      string
		mirror       string
		pathPrefix   bool
		skipFallback bool
		ca           []byte
		wantForm     talos.Form
	}{
		{name: "default-version", version: "", mirror: "http://10.0.0.5:5000", wantForm: talos.FormDocuments},
		{name: "v1.12-documents", version: "v1.12.0", mirror: "http://10.0.0.5:5000", wantForm: talos.FormDocuments},
		{name: "v1.12-path-prefix-skip-fallback", version: "v1.12.4", mirror: "http://10.0.0.5:5000", pathPrefix: true, skipFallback: true, wantForm: talos.FormDocuments},
		{name: "v1.13-https-ca", version: "v1.13.0", mirror: "https://cache.example:5443", ca: ca, wantForm: talos.FormDocuments},
		{name: "v1.11-legacy", version: "v1.11.5", mirror: "http://10.0.0.5:5000", wantForm: talos.FormLegacy},
		{name: "v1.11-legacy-path-prefix-skip-fallback", version: "v1.11.0", mirror: "http://10.0.0.5:5000", pathPrefix: true, skipFallback: true, wantForm: talos.FormLegacy},
		{name: "v1.10-legacy-https-ca", version: "v1.10.3", mirror: "https://cache.example:5443", ca: ca, wantForm: talos.FormLegacy},
		{name: "v1.9-legacy-skip-fallback", version: "v1.9.0", mirror: "http://10.0.0.5:5000", skipFallback: true, wantForm: talos.FormLegacy},
		{name: "loopback-mirror", version: "v1.12.0", mirror: "http://127.0.0.1:5000", wantForm: talos.FormDocuments},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := bootstraptest.Mirror(t, tc.mirror)
			opts := talos.Options{Mirror: m, Upstreams: upstreams, TalosVersion: tc.version, PathPrefix: tc.pathPrefix,
				SkipFallback: tc.skipFallback, MirrorCA: tc.ca, MirrorCAName: "test-ca.pem"}
			res, err := talos.Generate(opts)
			if err != nil {
				t.Fatalf("Generate: %v", err)
			}
			if res.Form != tc.wantForm {
				t.Fatalf("form %s, want %s", res.Form, tc.wantForm)
			}
			if !strings.HasPrefix(res.Patch, mirrorapi.ManagedMarker+"\n") {
				t.Fatalf("patch does not start with the marker:\n%s", res.Patch)
			}
			if tc.wantForm == talos.FormLegacy && strings.Contains(res.Patch, "RegistryMirrorConfig") {
				t.Fatalf("a %s target received the RegistryMirrorConfig kind:\n%s", res.TalosVersion, res.Patch)
			}
			if tc.wantForm == talos.FormDocuments && strings.Contains(res.Patch, "registries:") {
				t.Fatalf("a %s target received the legacy form:\n%s", res.TalosVersion, res.Patch)
			}
			base := workerConfig(t, res.TalosVersion)
			cfg := applyLikeANode(t, base, res.Patch)

			mirrors := cfg.RegistryMirrorConfigs()
			for _, n := range upstreams {
				mc, ok := mirrors[n]
				if !ok {
					t.Fatalf("no mirror for %s after patching; have %v", n, mirrors)
				}
				eps := mc.Endpoints()
				if len(eps) != 1 {
					t.Fatalf("%s: %d endpoints, want 1", n, len(eps))
				}
				want := m.String()
				if tc.pathPrefix {
					want += "/v2/" + n
				}
				if eps[0].Endpoint() != want || eps[0].OverridePath() != tc.pathPrefix {
					t.Fatalf("%s: endpoint %s overridePath=%v, want %s %v", n, eps[0].Endpoint(), eps[0].OverridePath(), want, tc.pathPrefix)
				}
				if mc.SkipFallback() != tc.skipFallback {
					t.Fatalf("%s: skipFallback %v, want %v", n, mc.SkipFallback(), tc.skipFallback)
				}
			}
			tlsCfgs := cfg.RegistryTLSConfigs()
			if tc.ca != nil {
				tc, ok := tlsCfgs[m.Host()]
				if !ok || !strings.Contains(string(tc.CA()), "BEGIN CERTIFICATE") {
					t.Fatalf("no CA for %s: %v", m.Host(), tlsCfgs)
				}
			} else if _, ok := tlsCfgs[m.Host()]; ok {
				t.Fatalf("TLS config written for an http mirror")
			}

			// The removal patch takes it all out again.
			rm := opts
			rm.Remove = true
			del, err := talos.Generate(rm)
			if err != nil {
				t.Fatalf("Generate --remove: %v", err)
			}
			after := applyLikeANode(t, base, res.Patch, del.Patch)
			for _, n := range upstreams {
				if _, ok := after.RegistryMirrorConfigs()[n]; ok {
					t.Fatalf("%s still mirrored after the removal patch:\n%s", n, del.Patch)
				}
			}
			if _, ok := after.RegistryTLSConfigs()[m.Host()]; ok && tc.ca != nil {
				t.Fatalf("mirror TLS config left after removal")
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	up := []string{"docker.io"}
	cases := []struct {
		name string
		opts talos.Options
		want string
	}{
		{"skip-fallback-below-1.9", talos.Options{Mirror: bootstraptest.Mirror(t, "http://10.0.0.5:5000"), Upstreams: up, TalosVersion: "v1.8.3", SkipFallback: true}, "Talos >= v1.9"},
		{"skip-fallback-loopback", talos.Options{Mirror: bootstraptest.Mirror(t, "http://127.0.0.1:5000"), Upstreams: up, TalosVersion: "v1.12.0", SkipFallback: true}, "loopback"},
		{"skip-fallback-localhost", talos.Options{Mirror: bootstraptest.Mirror(t, "http://localhost:5000"), Upstreams: up, SkipFallback: true}, "loopback"},
		{"path-prefix-below-1.3", talos.Options{Mirror: bootstraptest.Mirror(t, "http://10.0.0.5:5000"), Upstreams: up, TalosVersion: "v1.2.0", PathPrefix: true}, "Talos >= v1.3"},
		{"ca-on-http", talos.Options{Mirror: bootstraptest.Mirror(t, "http://10.0.0.5:5000"), Upstreams: up, MirrorCA: bootstraptest.CA(t)}, "https mirror"},
		{"ca-not-pem", talos.Options{Mirror: bootstraptest.Mirror(t, "https://10.0.0.5:5000"), Upstreams: up, MirrorCA: []byte("nope"), MirrorCAName: "x.pem"}, "no PEM certificate"},
		{"bad-version", talos.Options{Mirror: bootstraptest.Mirror(t, "http://10.0.0.5:5000"), Upstreams: up, TalosVersion: "latest"}, "--talos-version"},
		{"bad-upstream", talos.Options{Mirror: bootstraptest.Mirror(t, "http://10.0.0.5:5000"), Upstreams: []string{"not a host"}}, "upstream"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := talos.Generate(tc.opts)
			if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want refusal containing %q, got %v", tc.want, err)
			}
		})
	}
}

func validationStrict() []validation.Option { return []validation.Option{validation.WithStrict()} }
