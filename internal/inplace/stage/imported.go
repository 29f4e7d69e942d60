package stage

import (
	"context"
	"io"

	"github.com/kubelift/kubelift/internal/bundle"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/importer"
	"github.com/kubelift/kubelift/internal/inplace/release"
	"github.com/kubelift/kubelift/internal/registry"
)

// Imported is the release a verified bundle holds, staged right after
// import pushed it: with the binaries pushed (files, each with its
// artifact), nodes may pull them from the registry and this machine sends
// the rest from the file; with none pushed (--skip-binaries), everything
// comes from the file.
func Imported(v *bundle.Verified, version string, files []importer.FileResult, access registry.Access) (*release.Release, Source, error) {
	rel, err := release.FromBundle(v.Manifest)
	if err != nil {
		return nil, nil, err
	}
	if len(files) == 0 {
		return rel, BundleSource{Bundle: v}, nil
	}
	rel.Record = &cluster.Available{KubernetesVersion: version}
	for _, f := range files {
		rel.Record.Files = append(rel.Record.Files, cluster.BinaryRecord{Name: f.Name, Arch: f.Arch, SHA256: f.SHA256, Size: f.Size,
			Path: filePath(v.Manifest, f.SHA256), Artifact: f.Artifact})
	}
	for _, h := range rel.Hops {
		h.Record = rel.Record
	}
	return rel, pushedSource{BundleSource: BundleSource{Bundle: v}, RegistrySource: RegistrySource{Access: access}}, nil
}

// pushedSource is a bundle file whose binaries import has just pushed:
// this machine reads them from the file, nodes pull them from the
// registry.
type pushedSource struct {
	BundleSource
	RegistrySource
}

// Open reads the file from the bundle.
func (s pushedSource) Open(ctx context.Context, f bundle.File, artifact string) (io.ReadCloser, error) {
	return s.BundleSource.Open(ctx, f, artifact)
}

// filePath is the bundle path of the release's or a hop's file with
// sha256 sum.
func filePath(m *bundle.Manifest, sum string) string {
	for _, f := range m.Files {
		if f.SHA256 == sum {
			return f.Path
		}
	}
	for _, h := range m.Hops {
		for _, f := range h.Files {
			if f.SHA256 == sum {
				return f.Path
			}
		}
	}
	return ""
}
