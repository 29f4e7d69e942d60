package registry

import (
	"bytes"
	"fmt"
	"io"
)

// maxManifest bounds manifests read into memory (upstream registries cap
// them at 4 MiB).
const maxManifest = 4 << 20

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

func readAllLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("manifest larger than %d bytes", limit)
	}
	return b, nil
}
