package test

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/module"
)

// licenseFile matches the files that carry a module's license and notices.
var licenseFile = regexp.MustCompile(`^(?i)(LICEN[CS]E|COPYING|NOTICE)([.-].*)?$`)

// classify names the license of a license text.
func classify(text string) string {
	switch {
	case strings.Contains(text, "Apache License") && strings.Contains(text, "Version 2.0"):
		return "Apache-2.0"
	case strings.Contains(text, "Mozilla Public License") && strings.Contains(text, "2.0"):
		return "MPL-2.0"
	case strings.Contains(text, "Permission is hereby granted, free of charge"):
		return "MIT"
	case strings.Contains(text, "Redistribution and use in source and binary forms"):
		if strings.Contains(text, "Neither the name") || strings.Contains(text, "names of its contributors") {
			return "BSD-3-Clause"
		}
		return "BSD-2-Clause"
	case strings.Contains(text, "Permission to use, copy, modify, and/or distribute"), strings.Contains(text, "ISC License"):
		return "ISC"
	}
	return "see the text below"
}

// notices builds THIRD_PARTY_NOTICES.md for a binary: every module linked into it (its build
// info) and the Go standard library, each with its license files from the module cache. Apache
// 2.0 texts are not repeated (LICENSE holds the same text); NOTICE files, and every other license
// text, are given in full, as those licenses require for binary distribution. MPL-2.0 modules
// also say where their source is.
func notices(t *testing.T, bin string) string {
	t.Helper()
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("read build info of %s: %v", bin, err)
	}
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	modcache := strings.TrimSpace(string(out))
	var b strings.Builder
	b.WriteString(`# Third-party notices

nodecache binaries and images include the Go modules listed here (and the Go standard library).
Each is listed with its version, its license, and the license and notice texts it ships.
Apache-2.0 texts are the same as nodecache's own LICENSE and are not repeated; NOTICE files are.
MPL-2.0 modules are used unmodified; their source is at the address given, and the license text
is at the end.

Generated from the binary's build information by deploy/test (` + "`make notices`" + `);
a test checks that it lists exactly the modules linked into nodecache.

`)
	goroot := runtime.GOROOT()
	var mpl string
	writeEntry(t, &b, &mpl, "Go standard library", "", filepath.Join(goroot), []string{"LICENSE"})
	deps := slices.Clone(bi.Deps)
	slices.SortFunc(deps, func(a, c *debug.Module) int { return strings.Compare(a.Path, c.Path) })
	for _, d := range deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			t.Fatal(err)
		}
		escv, err := module.EscapeVersion(m.Version)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(modcache, esc+"@"+escv)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("%s %s is not in the module cache (%v): run go mod download", m.Path, m.Version, err)
		}
		var files []string
		for _, e := range entries {
			if !e.IsDir() && licenseFile.MatchString(e.Name()) {
				files = append(files, e.Name())
			}
		}
		if len(files) == 0 {
			t.Errorf("%s %s ships no license file in %s", m.Path, m.Version, dir)
		}
		writeEntry(t, &b, &mpl, d.Path, m.Version, dir, files)
	}
	if mpl != "" {
		fmt.Fprintf(&b, "## Mozilla Public License 2.0\n\nThe text the MPL-2.0 modules above ship:\n\n```text\n%s\n```\n", mpl)
	}
	return b.String()
}

func writeEntry(t *testing.T, b *strings.Builder, mpl *string, path, version, dir string, files []string) {
	t.Helper()
	title := path
	if version != "" {
		title += " " + version
	}
	var license string
	texts := map[string]string{}
	for _, f := range files {
		raw, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = strings.TrimSpace(strings.ReplaceAll(string(raw), "\r\n", "\n"))
		if !strings.HasPrefix(strings.ToUpper(f), "NOTICE") && license == "" {
			license = classify(texts[f])
		}
	}
	fmt.Fprintf(b, "## %s\n\nLicense: %s\n", title, license)
	if license == "MPL-2.0" {
		fmt.Fprintf(b, "Source: https://pkg.go.dev/%s@%s (the module's repository at that version)\n", path, version)
	}
	for _, f := range files {
		text := texts[f]
		if !strings.HasPrefix(strings.ToUpper(f), "NOTICE") && classify(text) == "Apache-2.0" && len(text) > 9000 {
			fmt.Fprintf(b, "\n%s: the Apache License 2.0, as in nodecache's LICENSE.\n", f)
			continue
		}
		if !strings.HasPrefix(strings.ToUpper(f), "NOTICE") && classify(text) == "MPL-2.0" && len(text) > 9000 {
			if *mpl == "" {
				*mpl = text
			}
			fmt.Fprintf(b, "\n%s: the Mozilla Public License 2.0, text at the end of this file.\n", f)
			continue
		}
		fmt.Fprintf(b, "\n%s:\n\n```text\n%s\n```\n", f, text)
	}
	b.WriteString("\n")
}

// TestThirdPartyNotices: THIRD_PARTY_NOTICES.md is what the current binary's modules require
// (NODECACHE_UPDATE_NOTICES=1 rewrites it: make notices).
func TestThirdPartyNotices(t *testing.T) {
	t.Parallel()
	want := notices(t, binary)
	path := filepath.Join(repoRoot, "THIRD_PARTY_NOTICES.md")
	if os.Getenv("NODECACHE_UPDATE_NOTICES") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		heads := func(s string) []string {
			var out []string
			for line := range strings.SplitSeq(s, "\n") {
				if strings.HasPrefix(line, "## ") {
					out = append(out, line)
				}
			}
			return out
		}
		var added, gone []string
		for _, h := range heads(want) {
			if !slices.Contains(heads(string(got)), h) {
				added = append(added, strings.TrimPrefix(h, "## "))
			}
		}
		for _, h := range heads(string(got)) {
			if !slices.Contains(heads(want), h) {
				gone = append(gone, strings.TrimPrefix(h, "## "))
			}
		}
		t.Fatalf("THIRD_PARTY_NOTICES.md is not current for the modules linked into nodecache (run make notices and commit it after a dependency change); linked but not listed: %v; listed but not linked: %v", added, gone)
	}
	if !strings.Contains(want, "## github.com/siderolabs/talos/pkg/machinery ") || !strings.Contains(want, "License: MPL-2.0") {
		t.Error("Talos machinery (MPL-2.0) is not among the notices")
	}
}
