package bundle

import (
	"archive/tar"
	"bufio"
	"os"
)

// ReadManifest returns a bundle's manifest without verifying anything (for
// `inspect`); signed reports whether a signature entry follows it.
func ReadManifest(path string) (m *Manifest, signed bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	if _, err := readStub(br); err != nil {
		return nil, false, &VerifyError{Bundle: path, Err: err}
	}
	tr := tar.NewReader(br)
	data, err := readSmallEntry(tr, ManifestName, maxManifestSize)
	if err != nil {
		return nil, false, &VerifyError{Bundle: path, Err: err}
	}
	m, err = parseManifest(data)
	if err != nil {
		return nil, false, &VerifyError{Bundle: path, Err: err}
	}
	hdr, err := tr.Next()
	return m, err == nil && hdr.Name == SignatureName, nil
}
