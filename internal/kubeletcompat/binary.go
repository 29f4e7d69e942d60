package kubeletcompat

import (
	"bufio"
	"bytes"
	"io"

	"github.com/kubelift/kubelift/pkg/hashskip"
)

// HonoursHashSkip reports whether a kubelet binary reads the hash-skip
// file: kubelift's kubelet build (make kubelet) links pkg/hashskip, whose
// PathEnv name is in every such binary and in no upstream kubelet.
func HonoursHashSkip(r io.Reader) (bool, error) {
	marker := []byte(hashskip.PathEnv)
	br := bufio.NewReaderSize(r, 1<<20)
	var carry []byte
	buf := make([]byte, 1<<20)
	for {
		n, err := br.Read(buf)
		if n > 0 {
			window := append(carry, buf[:n]...)
			if bytes.Contains(window, marker) {
				return true, nil
			}
			keep := min(len(marker)-1, len(window))
			carry = append(carry[:0:0], window[len(window)-keep:]...)
		}
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
}
