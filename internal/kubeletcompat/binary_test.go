package kubeletcompat

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/kubelift/kubelift/pkg/hashskip"
)

func TestHonoursHashSkip(t *testing.T) {
	for _, size := range []int{64, 3 << 20} { // within one read; across many
		filler := strings.Repeat("\x00", size)
		for _, tc := range []struct {
			name string
			data string
			want bool
		}{
			{"upstream", filler, false},
			{"patched, marker at the end", filler + hashskip.PathEnv, true},
			{"patched, marker at the start", hashskip.PathEnv + filler, true},
			{"patched, marker straddling reads", filler[:size/2] + hashskip.PathEnv + filler[size/2:], true},
			{"a prefix of the marker only", filler + hashskip.PathEnv[:len(hashskip.PathEnv)-1], false},
		} {
			readers := map[string]io.Reader{"whole": strings.NewReader(tc.data)}
			if size < 1<<10 {
				readers["byte by byte"] = iotest.OneByteReader(strings.NewReader(tc.data))
			}
			for how, r := range readers {
				got, err := HonoursHashSkip(r)
				if err != nil {
					t.Fatal(err)
				}
				if got != tc.want {
					t.Errorf("%d bytes, %s, read %s: got %v, want %v", size, tc.name, how, got, tc.want)
				}
			}
		}
	}
}
