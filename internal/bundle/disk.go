package bundle

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrNoSpace means a file system lacks room for what is about to be written.
var ErrNoSpace = fmt.Errorf("not enough free disk space")

// checkFree fails unless dir's file system has need bytes (plus 1 %) free.
// dir may not exist yet; its nearest existing parent is checked.
func checkFree(dir string, need int64) error {
	d := dir
	for {
		if _, err := os.Stat(d); err == nil {
			break
		}
		parent := filepath.Dir(d)
		if parent == d {
			break
		}
		d = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d, &st); err != nil {
		return fmt.Errorf("%s: free space: %w", d, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	want := need + need/100
	if free < want {
		return fmt.Errorf("%s: %w: need %s, %s free", d, ErrNoSpace, HumanBytes(want), HumanBytes(free))
	}
	return nil
}

// HumanBytes formats a byte count for people (1.5 GiB).
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
