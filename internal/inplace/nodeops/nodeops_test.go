package nodeops

import (
	"testing"
	"time"
)

// The unit restart's time is read off swap's last line, by the node's
// clock; a line that does not parse or does not fit in the call counts as
// nothing.
func TestRestartTime(t *testing.T) {
	for _, tc := range []struct {
		out  string
		call time.Duration
		want time.Duration
	}{
		{"### restart 100.25 110.75\n", 12 * time.Second, 10500 * time.Millisecond},
		{"some warning\n### restart 5.00 5.40\n", time.Second, 400 * time.Millisecond},
		{"", time.Second, 0},
		{"### restart 110.75 100.25\n", time.Minute, 0},      // backwards
		{"### restart 1 100\n", time.Second, 0},              // longer than the call
		{"### restart 1 x\n", time.Second, 0},                // not a number
		{"### restart 1 2 3\n", time.Minute, 0},              // not two numbers
		{"### restart NaN NaN\n", time.Minute, 0},            // NaN
		{"### restart 0 1e300\n", time.Duration(1 << 62), 0}, // out of range
	} {
		if got := restartTime(tc.out, tc.call); got != tc.want {
			t.Errorf("restartTime(%q, %s) = %s, want %s", tc.out, tc.call, got, tc.want)
		}
	}
}
