package catalog

import (
	"errors"
	"strings"
	"testing"
)

func TestHops(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		from, to string
		want     string // hop versions, or "error: ..."
	}{
		{"v1.30", "v1.33.13", "v1.31.14 v1.32.13"},
		{"v1.30.14", "v1.33.13", "v1.31.14 v1.32.13"},
		{"v1.32", "v1.33.13", ""},
		{"v1.33", "v1.33.13", ""},
		{"v1.34", "v1.37.2", "v1.35.4 v1.36.3"},
		{"v1.30", "v1.34.4", "error: kubelets at v1.30 would be 4 minors older than the API server at v1.34.4, and at most 3 is supported; upgrade to v1.31 first"},
		{"v1.34", "v1.33.13", "error: that is a downgrade"},
		{"v1.30.1-v1.31.2", "v1.33.13", "error: from must name one minor"},
	} {
		t.Run(tc.from+"-"+tc.to, func(t *testing.T) {
			from, err := ParseRange(tc.from)
			if err != nil {
				t.Fatal(err)
			}
			to, err := c.Lookup(tc.to)
			if err != nil {
				t.Fatal(err)
			}
			hops, err := c.Hops(from, to)
			if msg, isErr := strings.CutPrefix(tc.want, "error: "); isErr {
				if !errors.Is(err, ErrNoPath) || !strings.Contains(err.Error(), msg) {
					t.Fatalf("err = %v, want %q", err, msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, h := range hops {
				got = append(got, h.Version)
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("hops %v, want %s", got, tc.want)
			}
		})
	}
	// A withdrawn patch is no hop: with v1.31's only release withdrawn,
	// v1.30 has no way to v1.32.
	second := strings.NewReplacer("v1.31.4", "v1.32.1", "upgradeFrom: [v1.30]", "upgradeFrom: [v1.31]").Replace(strings.SplitN(good, "versions:\n", 2)[1])
	data := strings.Replace(good, "    upgradeFrom: [v1.30]\n", "    upgradeFrom: [v1.30]\n    withdrawn: true\n", 1) + second
	small, err := Parse("my.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	from, _ := ParseRange("v1.30")
	to, err := small.Lookup("v1.32.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := small.Hops(from, to); !errors.Is(err, ErrNoPath) || !strings.Contains(err.Error(), "my.yaml lists no release of v1.31 to pass through") {
		t.Errorf("err = %v", err)
	}
}
