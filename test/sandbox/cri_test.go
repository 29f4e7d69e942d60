package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The stand-in reports an absolute log path for every container, and the
// file exists, as with containerd: the kubelet removes "LOGPATH*", so an
// empty path would remove entries of its working directory.
func TestCRIStandInReportsLogPaths(t *testing.T) {
	dir := t.TempDir()
	endpoint := "unix://" + filepath.Join(dir, "cri.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeCRI(ctx, endpoint, 1<<20) }()
	t.Cleanup(func() { cancel(); <-done })
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(filepath.Join(dir, "cri.sock")); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rt := kubeapi.NewRuntimeServiceClient(conn)
	logDir := filepath.Join(dir, "pods", "shop_web-0_uid")
	sbCfg := &kubeapi.PodSandboxConfig{Metadata: &kubeapi.PodSandboxMetadata{Name: "web-0", Namespace: "shop", Uid: "uid"}, LogDirectory: logDir}
	sbx, err := rt.RunPodSandbox(ctx, &kubeapi.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		t.Fatal(err)
	}
	c, err := rt.CreateContainer(ctx, &kubeapi.CreateContainerRequest{PodSandboxId: sbx.PodSandboxId, SandboxConfig: sbCfg,
		Config: &kubeapi.ContainerConfig{Metadata: &kubeapi.ContainerMetadata{Name: "app"}, Image: &kubeapi.ImageSpec{Image: "x/app:1"}, LogPath: "app/0.log"}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := rt.ContainerStatus(ctx, &kubeapi.ContainerStatusRequest{ContainerId: c.ContainerId})
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(logDir, "app", "0.log")
	if st.Status.LogPath != want {
		t.Fatalf("log path %q, want %q", st.Status.LogPath, want)
	}
	if _, err := os.Stat(want); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.StopContainer(ctx, &kubeapi.StopContainerRequest{ContainerId: c.ContainerId, Timeout: 30}); err != nil {
		t.Fatal(err)
	}
	st, err = rt.ContainerStatus(ctx, &kubeapi.ContainerStatusRequest{ContainerId: c.ContainerId})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != kubeapi.ContainerState_CONTAINER_EXITED || st.Status.ExitCode != 143 || st.Status.Reason != "Error" {
		t.Errorf("stopped container: state %s exit %d reason %q, want EXITED 143 Error", st.Status.State, st.Status.ExitCode, st.Status.Reason)
	}
}
