package nodeaccess

import (
	"os/exec"
	"testing"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "''"},
		{"/usr/local/bin/kubelet", "/usr/local/bin/kubelet"},
		{"v1.31.4+k3s1,a=b:c@d%e_f-g", "v1.31.4+k3s1,a=b:c@d%e_f-g"},
		{"two words", "'two words'"},
		{"it's", `'it'\''s'`},
		{"'", `''\'''`},
		{"$(reboot)", "'$(reboot)'"},
		{"a\nb", "'a\nb'"},
		{"*", "'*'"},
		{"~root", "'~root'"},
		{"naïve", "'naïve'"},
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%q) = %s, want %s", tc.in, got, tc.want)
		}
		// The shell reads the quoted word back as the string itself.
		out, err := exec.Command("/bin/sh", "-c", "printf %s "+Quote(tc.in)).Output()
		if err != nil || string(out) != tc.in {
			t.Errorf("sh printf %s = %q, %v; want %q", Quote(tc.in), out, err, tc.in)
		}
	}
}
