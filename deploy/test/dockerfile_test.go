package test

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// TestDockerfile parses the Dockerfile with BuildKit's own parser: the build stage runs on the
// builder's platform and cross-compiles for TARGETOS/TARGETARCH without cgo, stamping VERSION and
// COMMIT; the final stage is the distroless static base, runs as a numeric non-root USER, and
// its ENTRYPOINT is the binary in exec form.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	res, err := parser.Parse(bytes.NewReader(readRepoFile(t, "Dockerfile")))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	for _, w := range res.Warnings {
		t.Errorf("parser warning: %s", w.Short)
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatalf("instructions: %v", err)
	}
	if len(stages) != 2 {
		t.Fatalf("%d stages, want build and final", len(stages))
	}
	build, final := stages[0], stages[1]
	if build.Platform != "$BUILDPLATFORM" {
		t.Errorf("build stage FROM --platform=%q, want $BUILDPLATFORM (cross-compile, no emulation)", build.Platform)
	}
	var args []string
	var run string
	for _, c := range build.Commands {
		switch c := c.(type) {
		case *instructions.ArgCommand:
			for _, a := range c.Args {
				args = append(args, a.Key)
			}
		case *instructions.RunCommand:
			if s := strings.Join(c.CmdLine, " "); strings.Contains(s, "go build") {
				run = s
			}
		}
	}
	for _, a := range []string{"TARGETOS", "TARGETARCH", "VERSION", "COMMIT"} {
		if !slices.Contains(args, a) {
			t.Errorf("build stage does not declare ARG %s", a)
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "GOOS=$TARGETOS", "GOARCH=$TARGETARCH", "-trimpath", "buildinfo.version=${VERSION}", "buildinfo.commit=${COMMIT}", "./cmd/nodecache"} {
		if !strings.Contains(run, want) {
			t.Errorf("go build step lacks %q: %s", want, run)
		}
	}
	if !strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") {
		t.Errorf("final base %q, want distroless static (the binary is static)", final.BaseName)
	}
	var user string
	var entrypoint *instructions.EntrypointCommand
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			entrypoint = c
		}
	}
	if m := regexp.MustCompile(`^([0-9]+)(:[0-9]+)?$`).FindStringSubmatch(user); m == nil || m[1] == "0" {
		t.Errorf("USER %q, want a numeric non-root uid (runAsNonRoot can verify only numbers)", user)
	}
	if entrypoint == nil || entrypoint.PrependShell || !slices.Equal(entrypoint.CmdLine, []string{"/usr/local/bin/nodecache"}) {
		t.Errorf("ENTRYPOINT %+v, want exec form [\"/usr/local/bin/nodecache\"]", entrypoint)
	}
}

// TestDockerignore: the build context leaves out .git, build outputs and the local cache of
// `make run`, and keeps what the build needs.
func TestDockerignore(t *testing.T) {
	t.Parallel()
	patterns, err := ignorefile.ReadAll(bytes.NewReader(readRepoFile(t, ".dockerignore")))
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	for path, excluded := range map[string]bool{
		".git/HEAD":                          true,
		".nodecache/docker/registry/v2/blob": true,
		"bin/nodecache":                      true,
		"dist/SHA256SUMS":                    true,
		"cmd/nodecache/nodecache.test":       true,
		"go.mod":                             false,
		"go.sum":                             false,
		"cmd/nodecache/main.go":              false,
		"pkg/mirror/server.go":               false,
		"pkg/bootstrap/bootstraptest/testdata/corpus/containerd-v3.txtar": false,
		"internal/buildinfo/buildinfo.go":                                 false,
		"LICENSE":                                                         false,
		"THIRD_PARTY_NOTICES.md":                                          false,
	} {
		got, err := pm.MatchesOrParentMatches(path)
		if err != nil {
			t.Fatal(err)
		}
		if got != excluded {
			t.Errorf("%s: excluded from the build context = %v, want %v", path, got, excluded)
		}
	}
}
