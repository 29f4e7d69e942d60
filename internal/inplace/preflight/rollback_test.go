package preflight

import (
	"errors"
	"strings"
	"testing"

	"github.com/kubelift/kubelift/internal/catalog"
)

func TestRollbackAllowed(t *testing.T) {
	cat, err := catalog.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, from, to string
		apiservers     map[string]string
		ok             bool
	}{
		{"no API server moved yet", "v1.30.14", "v1.31.4", map[string]string{"cp-1": "v1.30.14", "cp-2": "v1.30.14"}, true},
		{"a minor upgrade once an API server moved", "v1.30.14", "v1.31.4", map[string]string{"cp-1": "v1.31.4", "cp-2": "v1.30.14"}, false},
		{"a patch downgrade the catalog lists", "v1.31.2", "v1.31.4", map[string]string{"cp-1": "v1.31.4"}, true},
		{"an API server at a hop on the way", "v1.30.14", "v1.33.13", map[string]string{"cp-1": "v1.31.14", "cp-2": "v1.30.14"}, false},
	} {
		err := RollbackAllowed(cat, tc.from, tc.to, tc.apiservers)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
		want := "kube-apiserver on cp-1 runs " + tc.apiservers["cp-1"] + " already"
		if tc.to == "v1.33.13" {
			want += " (a release on the way to v1.33.13)"
		}
		if err != nil && (!errors.Is(err, ErrRollbackRefused) || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, want)
		}
	}
}
