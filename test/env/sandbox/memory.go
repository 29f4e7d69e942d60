package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Memory is what the sandbox's processes hold: the resident memory of
// every process in one of its network namespaces (machines, their
// services, containerd, shims and containers), summed. Pages processes
// share (the same binary run by several) count once per process: an
// upper bound.
type Memory struct {
	RSS       int64 // bytes
	Processes int
}

// Memory sums the resident memory (VmRSS) of every process whose network
// namespace is one of the sandbox's.
func (s *State) Memory() (Memory, error) {
	inodes := map[uint64]bool{}
	for _, m := range s.Machines {
		var st syscall.Stat_t
		if err := syscall.Stat("/run/netns/"+m.NetNS, &st); err != nil {
			return Memory{}, fmt.Errorf("network namespace %s: %w", m.NetNS, err)
		}
		inodes[st.Ino] = true
	}
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return Memory{}, err
	}
	var out Memory
	for _, d := range dirs {
		var st syscall.Stat_t
		if syscall.Stat(d+"/ns/net", &st) != nil || !inodes[st.Ino] {
			continue // gone, or not the sandbox's
		}
		kb, err := vmRSS(d + "/status")
		if err != nil {
			continue // ended meanwhile
		}
		out.RSS += kb << 10
		out.Processes++
	}
	return out, nil
}

func vmRSS(status string) (int64, error) {
	f, err := os.Open(status)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, nil // a kernel thread has none
}
