package test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestRelease runs `make release` and checks what it made: for linux/amd64, linux/arm64,
// darwin/amd64 and darwin/arm64 a binary of that format and CPU (ELF or Mach-O magic and
// header), built with CGO_ENABLED=0 and -trimpath, version and commit stamped; the ELF ones static (no
// interpreter, no shared libraries), the Mach-O ones linking only the system's libraries (macOS
// has no static executables), holding the "Linux only" refusal of status and agent; SHA256SUMS
// matching; LICENSE and the notices beside them. The binary for this machine's platform runs `version`.
func TestRelease(t *testing.T) {
	t.Parallel()
	dist := t.TempDir()
	const version = "v0.0.0-releasetest"
	cmd := exec.CommandContext(t.Context(), "make", "-C", repoRoot, "release", "DIST="+dist, "VERSION="+version, "COMMIT=0123456789abcdef")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	sums := map[string]string{}
	f, err := os.Open(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, file, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not `sum  file`", sc.Text())
		}
		sums[file] = sum
	}
	for _, doc := range []string{"LICENSE", "THIRD_PARTY_NOTICES.md"} {
		if _, err := os.Stat(filepath.Join(dist, doc)); err != nil {
			t.Errorf("%s not in the release: %v", doc, err)
		}
	}
	for _, tc := range []struct {
		goos, goarch string
		elfMachine   elf.Machine
		machoCPU     macho.Cpu
	}{
		{"linux", "amd64", elf.EM_X86_64, 0},
		{"linux", "arm64", elf.EM_AARCH64, 0},
		{"darwin", "amd64", 0, macho.CpuAmd64},
		{"darwin", "arm64", 0, macho.CpuArm64},
	} {
		name := "nodecache-" + version + "-" + tc.goos + "-" + tc.goarch
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dist, name)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(raw)
			if sums[name] != hex.EncodeToString(sum[:]) {
				t.Errorf("SHA256SUMS says %q, the file is %x", sums[name], sum)
			}
			switch tc.goos {
			case "linux":
				if !bytes.HasPrefix(raw, []byte("\x7fELF")) {
					t.Fatalf("not ELF: % x", raw[:4])
				}
				ef, err := elf.NewFile(bytes.NewReader(raw))
				if err != nil {
					t.Fatal(err)
				}
				if ef.Machine != tc.elfMachine {
					t.Errorf("machine %s, want %s", ef.Machine, tc.elfMachine)
				}
				for _, p := range ef.Progs {
					if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
						t.Errorf("not static: program header %s", p.Type)
					}
				}
				if libs, _ := ef.ImportedLibraries(); len(libs) > 0 {
					t.Errorf("not static: needs %v", libs)
				}
			case "darwin":
				magic := []byte{0xcf, 0xfa, 0xed, 0xfe} // MH_MAGIC_64, little-endian
				if !bytes.HasPrefix(raw, magic) {
					t.Fatalf("not a 64-bit Mach-O: % x", raw[:4])
				}
				mf, err := macho.NewFile(bytes.NewReader(raw))
				if err != nil {
					t.Fatal(err)
				}
				if mf.Cpu != tc.machoCPU {
					t.Errorf("cpu %s, want %s", mf.Cpu, tc.machoCPU)
				}
				libs, err := mf.ImportedLibraries()
				if err != nil {
					t.Fatal(err)
				}
				for _, l := range libs {
					if !strings.HasPrefix(l, "/usr/lib/") && !strings.HasPrefix(l, "/System/Library/") {
						t.Errorf("links %s, not a system library", l)
					}
				}
				if !bytes.Contains(raw, []byte("is Linux only")) {
					t.Error(`no "Linux only" refusal for status and agent in the darwin build`)
				}
			}
			bi, err := buildinfo.Read(bytes.NewReader(raw))
			if err != nil {
				t.Fatalf("build info: %v", err)
			}
			settings := map[string]string{}
			for _, s := range bi.Settings {
				settings[s.Key] = s.Value
			}
			for k, v := range map[string]string{"CGO_ENABLED": "0", "GOOS": tc.goos, "GOARCH": tc.goarch, "-trimpath": "true"} {
				if settings[k] != v {
					t.Errorf("built with %s=%q, want %q", k, settings[k], v)
				}
			}
			// -trimpath keeps -ldflags out of the build info: look for the stamped strings.
			for _, stamp := range []string{version, "0123456789abcdef"} {
				if !bytes.Contains(raw, []byte(stamp)) {
					t.Errorf("%q is not stamped into the binary", stamp)
				}
			}
			if tc.goos == runtime.GOOS && tc.goarch == runtime.GOARCH {
				out, err := exec.CommandContext(t.Context(), path, "version", "--output", "json").Output()
				if err != nil {
					t.Fatalf("version: %v", err)
				}
				var v struct{ Version, Commit, Platform string }
				if err := json.Unmarshal(out, &v); err != nil {
					t.Fatal(err)
				}
				if v.Version != version || v.Commit != "0123456789abcdef" || v.Platform != "linux/amd64" {
					t.Errorf("version says %+v", v)
				}
			}
		})
	}
}
