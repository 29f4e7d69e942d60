// Package images builds the container images the sandbox's real runtime
// runs, locally and reproducibly (no registry outside the sandbox is ever
// asked): the pause image from Kubernetes' own pause.c (in the
// k8s.io/kubernetes module, compiled static with gcc) and the workload
// image from shopd (a static Go HTTP server, ./shopd). Layers carry fixed
// timestamps, so the same sources give the same digests on every machine.
package images

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubelift/kubelift/test/env/kube"
)

// PauseTag is the pause image's tag (Kubernetes 1.30 to 1.34 use 3.10).
const PauseTag = "3.10"

// Set is the images the sandbox runs.
type Set struct {
	// Pause is registry.k8s.io/pause:PauseTag, built from pause.c.
	Pause v1.Image
	// Shop is the workload image (entrypoint /shopd).
	Shop v1.Image
}

// Build compiles pause and shopd in workDir and returns their images.
// kubeVersion names the k8s.io/kubernetes module whose pause.c is built
// (it is in the module cache once the sandbox has built Kubernetes).
func Build(ctx context.Context, workDir, kubeVersion string) (*Set, error) {
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return nil, err
	}
	src, err := moduleDir(ctx, "k8s.io/kubernetes@"+kubeVersion)
	if err != nil {
		return nil, err
	}
	pauseBin := filepath.Join(workDir, "pause")
	cmd := exec.CommandContext(ctx, "gcc", "-Os", "-static", "-Wall", "-Werror",
		fmt.Sprintf("-DVERSION=v%s-kubelift", PauseTag), "-o", pauseBin, filepath.Join(src, "build/pause/linux/pause.c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build pause (gcc, static; Debian's libc6-dev): %v: %s", err, out)
	}
	shopBin := filepath.Join(workDir, "shopd")
	cmd = exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", shopBin, "github.com/kubelift/kubelift/test/env/images/shopd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = moduleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build shopd: %v: %s", err, out)
	}
	pause, err := image(pauseBin, "/pause", nil)
	if err != nil {
		return nil, err
	}
	shop, err := image(shopBin, "/shopd", nil)
	if err != nil {
		return nil, err
	}
	return &Set{Pause: pause, Shop: shop}, nil
}

// image is one static binary at path in an otherwise empty image, run as
// root with entrypoint path and args as its command.
func image(bin, path string, cmd []string) (v1.Image, error) {
	layer, err := layerOf([]entry{{name: path, src: bin, mode: 0o755}})
	if err != nil {
		return nil, err
	}
	return imageOf(layer, func(c *v1.Config) {
		c.Entrypoint = []string{path}
		c.Cmd = cmd
	})
}

// imageOf is an OCI image of one layer, linux/amd64, run as root, with a
// fixed creation time; configure sets its entrypoint, command or env.
func imageOf(layer v1.Layer, configure func(*v1.Config)) (v1.Image, error) {
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
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	cf.Config.User = "0"
	configure(&cf.Config)
	return mutate.ConfigFile(img, cf)
}

// moduleDir is where the module cache holds mod (downloading it through
// the module proxy if it is not there yet).
func moduleDir(ctx context.Context, mod string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", mod)
	cmd.Dir = moduleRoot()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %v", mod, err)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", mod, err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %s", mod, info.Error)
	}
	return info.Dir, nil
}

// moduleRoot is kubelift's module root, for the go commands that need
// the module.
func moduleRoot() string {
	if root, err := kube.RepoRoot(); err == nil {
		return root
	}
	return "."
}
