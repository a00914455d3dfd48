package warm

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// baseConfig is a Config that passes every check but the images.
func baseConfig() Config {
	return Config{Mirror: "http://10.0.0.5:5000", Concurrency: 4, BlobTimeout: time.Minute, Retries: 1}
}

// TestImagesFromStdin: a list on stdin with comments, blank lines and surrounding space; a bad
// line is reported as -:LINE with the reference's own refusal, every bad line at once.
func TestImagesFromStdin(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		list     string
		args     []string
		talos    bool
		wantRefs []string
		wantFrom [][]string
		wantErrs []string // each in the error, in this order
	}{
		{
			name:     "comments blank lines and spaces",
			list:     "# images for the edge nodes\n\n  nginx:1.27  \n\tghcr.io/siderolabs/kubelet:v1.35.0\r\n# done\n",
			wantRefs: []string{"docker.io/library/nginx:1.27", "ghcr.io/siderolabs/kubelet:v1.35.0"},
			wantFrom: [][]string{{"-:3"}, {"-:4"}},
		},
		{
			name:     "bad lines named by line",
			list:     "nginx\n# fine\nnginx latest\nalpine;id\nbusybox\n",
			wantErrs: []string{`-:3: image reference "nginx latest" refused`, `-:4: image reference "alpine;id" refused: `, "shell metacharacter"},
		},
		{
			name:     "talos then list then arguments, duplicates once",
			talos:    true,
			list:     "docker.io/library/nginx:latest\nregistry.k8s.io/pause:3.10.1\n",
			args:     []string{"nginx", "alpine"},
			wantRefs: append(slices.Clone(mustTalos(t).Images), "docker.io/library/nginx:latest", "docker.io/library/alpine:latest"),
		},
		{
			name:     "an empty list and no other source is nothing to warm",
			list:     "# nothing yet\n\n",
			wantErrs: []string{"nothing to warm: --images-from - lists no image"},
		},
		{
			name:     "an empty list beside an IMAGE",
			list:     "# nothing yet\n",
			args:     []string{"nginx"},
			wantRefs: []string{"docker.io/library/nginx:latest"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := baseConfig()
			c.ImagesFrom, c.Stdin, c.Talos = "-", strings.NewReader(tc.list), tc.talos
			opts, err := c.Options(tc.args)
			if len(tc.wantErrs) > 0 {
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("err %v, want a refusal", err)
				}
				msg, at := err.Error(), 0
				for _, w := range tc.wantErrs {
					i := strings.Index(msg[at:], w)
					if i < 0 {
						t.Fatalf("error %q lacks %q (in order)", msg, w)
					}
					at += i + len(w)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range opts.Images {
				got = append(got, r.String())
			}
			if !slices.Equal(got, tc.wantRefs) {
				t.Fatalf("images %v, want %v", got, tc.wantRefs)
			}
			if len(opts.Sources) != len(opts.Images) {
				t.Fatalf("%d sources for %d images", len(opts.Sources), len(opts.Images))
			}
			for i, w := range tc.wantFrom {
				if !slices.Equal(opts.Sources[i].From, w) {
					t.Fatalf("source %d from %v, want %v", i, opts.Sources[i].From, w)
				}
			}
			if tc.talos {
				nginx := opts.Sources[len(opts.Sources)-2]
				if !slices.Equal(nginx.From, []string{"-:1", "argument 1"}) {
					t.Fatalf("nginx named by %v, want the list line and the argument", nginx.From)
				}
				pause := opts.Sources[2]
				if !strings.HasPrefix(pause.From[0], "--talos ") || !strings.HasSuffix(pause.From[0], "(pause)") || pause.From[1] != "-:2" {
					t.Fatalf("pause named by %v", pause.From)
				}
			}
		})
	}
}

func mustTalos(t *testing.T) TalosJoinSet {
	t.Helper()
	s, err := TalosJoinImages("")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPrintNeedsNoMirror: --print takes no --mirror; without --print it is required.
func TestPrintNeedsNoMirror(t *testing.T) {
	t.Parallel()
	c := baseConfig()
	c.Mirror = ""
	if _, err := c.Options([]string{"nginx"}); err == nil || !strings.Contains(err.Error(), "mirror") {
		t.Fatalf("no --mirror accepted without --print: %v", err)
	}
	c.Print = true
	opts, err := c.Options([]string{"nginx"})
	if err != nil || opts.Mirror != nil || len(opts.Sources) != 1 || opts.Sources[0].Reference != "docker.io/library/nginx:latest" {
		t.Fatalf("--print without --mirror: %+v %v", opts.Sources, err)
	}
	c.Mirror = "10.0.0.5:5000"
	if _, err := c.Options([]string{"nginx"}); err == nil {
		t.Fatal("a malformed --mirror is still refused with --print")
	}
}

func TestImagesFromFile(t *testing.T) {
	t.Parallel()
	c := baseConfig()
	c.ImagesFrom = "/nonexistent/images.txt"
	_, err := c.Options(nil)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), `--images-from "/nonexistent/images.txt" refused: cannot read it`) {
		t.Fatalf("missing file: %v", err)
	}
	c.ImagesFrom, c.Stdin = "-", strings.NewReader(strings.Repeat("a", maxListLine+1)+"\n")
	if _, err := c.Options(nil); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "-:1") {
		t.Fatalf("over-long line: %v", err)
	}
}
