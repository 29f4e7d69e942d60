package image

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// program builds a small program for this machine: static, or linked
// to the C library (cgo, with the resolver of net).
func program(t *testing.T, cgo bool) string {
	t.Helper()
	dir := t.TempDir()
	src, env := "package main\n\nfunc main() {}\n", "CGO_ENABLED=0"
	if cgo {
		src, env = "package main\n\nimport \"net\"\n\nfunc main() { _, _ = net.LookupHost(\"localhost\") }\n", "CGO_ENABLED=1"
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/p\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", "prog", ".")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "prog")
}

// The image holds the program alone, runs it, and has one digest for
// one program.
func TestBuild(t *testing.T) {
	prog := program(t, false)
	img, err := Build(prog, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(prog, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two builds of one program: %s and %s", d1, d2)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Architecture != runtime.GOARCH || cf.OS != "linux" || strings.Join(cf.Config.Entrypoint, " ") != Program || !cf.Created.IsZero() {
		t.Errorf("config %+v", cf)
	}
	layers, _ := img.Layers()
	if len(layers) != 1 {
		t.Fatalf("%d layers", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want, _ := os.ReadFile(prog)
	tr := tar.NewReader(rc)
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		// Nothing of the machine that built it: no times, no owners.
		if !h.ModTime.IsZero() && h.ModTime.Unix() != 0 || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %s, owner %d:%d (%q:%q)", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if "/"+h.Name == Program {
			got, _ := io.ReadAll(tr)
			found = bytes.Equal(got, want) && h.Mode == 0o755
		}
	}
	if !found {
		t.Errorf("the layer has no %s (mode 0755) with the program's bytes", Program)
	}
}

// A program that needs a C library, or is for another machine, is
// refused, saying how to build one that is not.
func TestRefusals(t *testing.T) {
	if _, err := Build(program(t, true), runtime.GOARCH); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("a dynamic program: %v", err)
	}
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	if _, err := Build(program(t, false), other); err == nil || !strings.Contains(err.Error(), "not "+other) {
		t.Errorf("a program for another arch: %v", err)
	}
	notELF := filepath.Join(t.TempDir(), "script")
	_ = os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	if _, err := Build(notELF, runtime.GOARCH); err == nil || !strings.Contains(err.Error(), "not a linux program") {
		t.Errorf("a script: %v", err)
	}
}
