package harness

import (
	"reflect"
	"testing"
)

func TestParseTasks(t *testing.T) {
	got, err := parseTasks(`TASK                                                                PID     STATUS
0d7b0f0b6a4e8b1c    1234    RUNNING
5e2c    77      STOPPED
`)
	if want := map[string]int{"0d7b0f0b6a4e8b1c": 1234}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("parseTasks = %v, %v; want %v", got, err, want)
	}
	if got, err := parseTasks("TASK    PID    STATUS\n"); err != nil || len(got) != 0 {
		t.Errorf("no task: %v, %v", got, err)
	}
	// As the product reads it: a RUNNING task without a process is not
	// running (it is not in the map, so a test comparing PIDs sees it gone).
	if got, err := parseTasks("TASK PID STATUS\nabc 0 RUNNING\n"); err != nil || len(got) != 0 {
		t.Errorf("RUNNING with PID 0: %v, %v", got, err)
	}
	for _, bad := range []string{"", "ID PID STATUS\n", "TASK PID STATUS\nabc x RUNNING\n", "TASK PID STATUS\nabc 12\n"} {
		if got, err := parseTasks(bad); err == nil {
			t.Errorf("parseTasks(%q) = %v, want an error", bad, got)
		}
	}
}
