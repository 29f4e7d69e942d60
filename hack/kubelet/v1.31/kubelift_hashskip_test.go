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

	"github.com/kubelift/kubelift/pkg/hashskip"

	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
)

// The dual-era rule inside computePodActions: a container whose recorded
// hash is the 1.30 era's hash of its current spec is kept; one whose spec
// changed since (its image set in place) is restarted; so is every
// container without the file, or with a file of this kubelet's own era.
func TestKubeliftHashSkip(t *testing.T) {
	ctx := context.Background()
	_, _, m, err := createTestRuntimeManager()
	require.NoError(t, err)
	_, baseStatus := makeBasePodAndStatus()
	noAction := podActions{
		SandboxID:         baseStatus.SandboxStatuses[0].Id,
		ContainersToStart: []int{},
		ContainersToKill:  map[kubecontainer.ContainerID]containerToKillInfo{},
	}
	// restartOne: container 1 of pod (as it is now) killed and started.
	restartOne := func(pod *v1.Pod, status *kubecontainer.PodStatus) podActions {
		return podActions{
			SandboxID:         baseStatus.SandboxStatuses[0].Id,
			ContainersToKill:  getKillMap(pod, status, []int{1}),
			ContainersToStart: []int{1},
		}
	}
	skipFile := filepath.Join(t.TempDir(), "kubelift-hash-skip.json")
	t.Setenv(hashskip.PathEnv, skipFile)
	setFile := func(f *hashskip.File) {
		if f != nil {
			require.NoError(t, hashskip.Write(skipFile, f))
		} else if err := os.Remove(skipFile); err != nil && !os.IsNotExist(err) {
			require.NoError(t, err)
		}
		kubeliftHashSkip.Lock()
		kubeliftHashSkip.read = time.Time{} // read again
		kubeliftHashSkip.Unlock()
	}
	from130 := &hashskip.File{OldKubeletVersion: "v1.30.14", OldHashEra: hashskip.EraJSONWithoutResources}
	// What a 1.30 kubelet recorded for the container as it is, and for it
	// before its image was changed in place.
	oldEra := func(c *v1.Container) uint64 {
		h, ok := kubeliftOldEraHash(c)(hashskip.EraJSON)
		require.True(t, ok)
		return h
	}
	for desc, test := range map[string]struct {
		file    *hashskip.File
		changed bool // the image was set in place after the old kubelet started it
		restart bool
	}{
		"no hash-skip file: restarted, as upstream":                      {nil, false, true},
		"started by the 1.30 kubelet, spec unchanged: kept":              {from130, false, false},
		"started by the 1.30 kubelet, image changed in place: restarted": {from130, true, true},
		"file of this kubelet's own era: restarted (a real change)":      {&hashskip.File{OldKubeletVersion: "v1.31.3", OldHashEra: hashskip.EraNameImage}, false, true},
	} {
		t.Run(desc, func(t *testing.T) {
			setFile(test.file)
			pod, status := makeBasePodAndStatus()
			pod.Spec.RestartPolicy = v1.RestartPolicyAlways
			started := pod.Spec.Containers[1].DeepCopy()
			status.ContainerStatuses[1].Hash = oldEra(started)
			if test.changed {
				pod.Spec.Containers[1].Image = "busybox:changed-in-place"
			}
			// The outcome is the same after this kubelet restarts: nothing
			// in the rule depends on when it or the container started.
			want := noAction
			if test.restart {
				want = restartOne(pod, status)
			}
			for _, started := range []time.Time{time.Now().Add(-time.Hour), time.Now().Add(time.Hour)} {
				status.ContainerStatuses[1].StartedAt = started
				actions := m.computePodActions(ctx, pod, status)
				verifyActions(t, &want, &actions, desc)
			}
		})
	}
}
