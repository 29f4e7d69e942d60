// Package image builds the agent's container image: one layer holding
// the upgrade program (which is also the agent: upgrade agent), for one
// architecture, made the same way every time (no dates, fixed owners),
// so one program gives one digest. The program must be static: the
// image has nothing else, no C library among it.
package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Program is where the image keeps the upgrade program.
const Program = "/kubelift/upgrade"

// Repository is the image's repository name upstream of any registry
// (import pushes it as DOMAIN/NAMESPACE/kubelift-agent).
const Repository = "kubelift.dev/kubelift-agent"

// Build makes the agent's image for linux/arch from the program at
// path, refusing a program that is not a static linux/arch executable.
func Build(path, arch string) (v1.Image, error) {
	if err := checkStatic(path, arch); err != nil {
		return nil, fmt.Errorf("agent image: %s: %w", path, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("agent image: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "kubelift/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: Program[1:], Mode: 0o755, Size: int64(len(data))},
	} {
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Entrypoint = []string{Program}
	cf.Config.User = "0"
	cf.Config.Labels = map[string]string{"org.opencontainers.image.title": "kubelift agent"}
	return mutate.ConfigFile(img, cf)
}

// goArch is ELF's machine for each architecture the catalog offers.
var goArch = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkStatic refuses a program that is not an executable for
// linux/arch, or that asks for a dynamic loader.
func checkStatic(path, arch string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("not a linux program: %w", err)
	}
	defer f.Close()
	want, ok := goArch[arch]
	if !ok {
		return fmt.Errorf("arch %q: the agent is built for amd64 or arm64", arch)
	}
	if f.Machine != want {
		return fmt.Errorf("built for %s, not %s", f.Machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (it needs a C library the image does not have): build it with CGO_ENABLED=0, as make build does")
		}
	}
	return nil
}
