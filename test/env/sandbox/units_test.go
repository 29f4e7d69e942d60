package sandbox

import (
	"fmt"
	"strings"
	"testing"
)

// Config.APIServerFeatureGates reaches the binary API servers' command
// line; without it, no --feature-gates is given.
func TestAPIServerFeatureGates(t *testing.T) {
	for _, gates := range []string{"", "APIServerTracing=false"} {
		s := &State{APIServerFeatureGates: gates}
		unit := fmt.Sprintf(apiserverUnit, "10.77.0.11", "http://10.77.0.11:2379", s.apiserverExtraFlags())
		want := "  --allow-privileged=true\n"
		if gates != "" {
			want = "  --allow-privileged=true --feature-gates=" + gates + "\n"
		}
		if !strings.Contains(unit, want) || strings.Count(unit, "--feature-gates") != strings.Count(want, "--feature-gates") || strings.Contains(unit, "%!") {
			t.Errorf("gates %q: the unit lacks %q:\n%s", gates, want, unit)
		}
	}
}
