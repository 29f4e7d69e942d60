//go:build ignore

// kubelift: tests of the hash-skip cache, added beside upstream's
// TestComputePodActions by hack/build-kubelet.sh; not upstream code.

package kuberuntime

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/version"

	"github.com/kubelift/kubelift/pkg/hashskip"

	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
)

// Run with -ldflags "-X k8s.io/component-base/version.gitVersion=v1.31.4"
// (hack/build-kubelet.sh does), so this kubelet is a 1.31.4 one.
func TestKubeliftHashSkip(t *testing.T) {
	require.Equal(t, "v1.31.4", version.Get().GitVersion, "build the test with the kubelet's version stamped")
	ctx := context.Background()
	_, _, m, err := createTestRuntimeManager()
	require.NoError(t, err)
	basePod, baseStatus := makeBasePodAndStatus()
	noAction := podActions{
		SandboxID:         baseStatus.SandboxStatuses[0].Id,
		ContainersToStart: []int{},
		ContainersToKill:  map[kubecontainer.ContainerID]containerToKillInfo{},
	}
	restartOne := podActions{
		SandboxID:         baseStatus.SandboxStatuses[0].Id,
		ContainersToKill:  getKillMap(basePod, baseStatus, []int{1}),
		ContainersToStart: []int{1},
	}
	// An old-era hash (what a 1.30 kubelet recorded for such a container).
	const oldEraHash = uint64(0x3c42280f)
	skipFile := filepath.Join(t.TempDir(), "kubelift-hash-skip.json")
	t.Setenv(hashskip.PathEnv, skipFile)
	setFile := func(f *hashskip.File) {
		if f != nil {
			require.NoError(t, hashskip.Write(skipFile, f))
		}
		kubeliftHashSkip.Lock()
		kubeliftHashSkip.read = time.Time{} // read again
		kubeliftHashSkip.Unlock()
	}

	for desc, test := range map[string]struct {
		file           *hashskip.File
		containerStart time.Time
		actions        podActions
	}{
		"no hash-skip file: restarted, as upstream": {
			file:           nil,
			containerStart: kubeliftKubeletStart.Add(-time.Hour),
			actions:        restartOne,
		},
		"started before this kubelet, file from the 1.30 kubelet: kept": {
			file:           &hashskip.File{OldKubeletVersion: "v1.30.14"},
			containerStart: kubeliftKubeletStart.Add(-time.Hour),
			actions:        noAction,
		},
		"started after this kubelet: restarted, as upstream": {
			file:           &hashskip.File{OldKubeletVersion: "v1.30.14"},
			containerStart: kubeliftKubeletStart.Add(time.Second),
			actions:        restartOne,
		},
		"file records this kubelet's own version: restarted": {
			file:           &hashskip.File{OldKubeletVersion: "v1.31.4"},
			containerStart: kubeliftKubeletStart.Add(-time.Hour),
			actions:        restartOne,
		},
	} {
		t.Run(desc, func(t *testing.T) {
			if test.file == nil {
				require.NoError(t, removeIfExists(skipFile))
			}
			setFile(test.file)
			pod, status := makeBasePodAndStatus()
			pod.Spec.RestartPolicy = v1.RestartPolicyAlways
			status.ContainerStatuses[1].Hash = oldEraHash
			status.ContainerStatuses[1].StartedAt = test.containerStart
			actions := m.computePodActions(ctx, pod, status)
			verifyActions(t, &test.actions, &actions, desc)
		})
	}
}

func removeIfExists(p string) error {
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
