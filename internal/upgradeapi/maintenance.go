package upgradeapi

import (
	"fmt"
	"slices"
	"time"
)

// MaintenanceWindow is when an Upgrade may start a node, in UTC: from
// Start to End on each of Days (every day when none); an End before
// Start ends the next day.
type MaintenanceWindow struct {
	Days  []string `json:"days,omitempty"`
	Start string   `json:"start"`
	End   string   `json:"end"`
}

var weekdays = []string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}

func (w *MaintenanceWindow) check() error {
	for _, d := range w.Days {
		if !slices.Contains(weekdays, d) {
			return fmt.Errorf("days: %q: want Mon, Tue, Wed, Thu, Fri, Sat or Sun", d)
		}
	}
	if _, err := clock(w.Start); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if _, err := clock(w.End); err != nil {
		return fmt.Errorf("end: %w", err)
	}
	if w.Start == w.End {
		return fmt.Errorf("start and end are both %s: an empty window", w.Start)
	}
	return nil
}

// clock reads HH:MM as minutes after midnight.
func clock(s string) (int, error) {
	t, err := time.Parse("15:04", s)
	if err != nil || len(s) != 5 {
		return 0, fmt.Errorf("%q: want HH:MM, 24-hour, UTC", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

// Open says whether the window is open at t; a nil window always is.
// A window that does not parse is closed (Check refuses it first).
func (w *MaintenanceWindow) Open(t time.Time) bool {
	if w == nil {
		return true
	}
	start, err1 := clock(w.Start)
	end, err2 := clock(w.End)
	if err1 != nil || err2 != nil {
		return false
	}
	t = t.UTC()
	now := t.Hour()*60 + t.Minute()
	day := t.Weekday()
	switch {
	case start < end && start <= now && now < end:
	case start > end && now >= start:
	case start > end && now < end:
		day = (day + 6) % 7 // the window opened the day before
	default:
		return false
	}
	return len(w.Days) == 0 || slices.Contains(w.Days, weekdays[day])
}

// String says the window as a person reads it.
func (w *MaintenanceWindow) String() string {
	days := "every day"
	if len(w.Days) > 0 {
		days = fmt.Sprint(w.Days)
	}
	return fmt.Sprintf("%s-%s UTC, %s", w.Start, w.End, days)
}
