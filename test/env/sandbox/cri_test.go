package sandbox

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubelift/kubelift/internal/kubeletcompat"
)

// startCRI serves the stand-in on a socket in a temporary directory until
// the test ends, and connects to it.
func startCRI(t *testing.T) (context.Context, string, string, kubeapi.RuntimeServiceClient) {
	t.Helper()
	dir := t.TempDir()
	endpoint := "unix://" + filepath.Join(dir, "cri.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeCRI(ctx, endpoint, 1<<20) }()
	t.Cleanup(func() { cancel(); <-done })
	for i := 0; ; i++ {
		if _, err := os.Stat(filepath.Join(dir, "cri.sock")); err == nil {
			break
		}
		if i == 3000 {
			t.Fatal("the CRI stand-in did not listen within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return ctx, dir, endpoint, kubeapi.NewRuntimeServiceClient(conn)
}

// The stand-in reports an absolute log path for every container, and the
// file exists, as with containerd: the kubelet removes "LOGPATH*", so an
// empty path would remove entries of its working directory.
func TestCRIStandInReportsLogPaths(t *testing.T) {
	ctx, dir, _, rt := startCRI(t)
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

// The crictl stand-in prints `crictl ps -o json` in crictl's shape, which
// kubeletcompat reads: running containers with their hash annotations.
func TestCrictlStandInPs(t *testing.T) {
	ctx, dir, endpoint, rt := startCRI(t)
	sbCfg := &kubeapi.PodSandboxConfig{Metadata: &kubeapi.PodSandboxMetadata{Name: "web-0", Namespace: "shop", Uid: "uid-1"}, LogDirectory: filepath.Join(dir, "pods")}
	sbx, err := rt.RunPodSandbox(ctx, &kubeapi.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, name := range []string{"app", "stopped"} {
		c, err := rt.CreateContainer(ctx, &kubeapi.CreateContainerRequest{PodSandboxId: sbx.PodSandboxId, SandboxConfig: sbCfg,
			Config: &kubeapi.ContainerConfig{Metadata: &kubeapi.ContainerMetadata{Name: name}, Image: &kubeapi.ImageSpec{Image: "x/app:1"}, LogPath: name + ".log",
				Labels: map[string]string{"io.kubernetes.pod.uid": "uid-1", "io.kubernetes.pod.name": "web-0", "io.kubernetes.pod.namespace": "shop",
					"io.kubernetes.container.name": name},
				Annotations: map[string]string{kubeletcompat.HashAnnotation: "1575786e"}}})
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = c.ContainerId
		if _, err := rt.StartContainer(ctx, &kubeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rt.StopContainer(ctx, &kubeapi.StopContainerRequest{ContainerId: ids["stopped"]}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want int
	}{{[]string{"ps", "-o", "json"}, 1}, {[]string{"ps", "-a", "-o", "json"}, 2}} {
		var out strings.Builder
		if err := Crictl(ctx, endpoint, tc.args, &out); err != nil {
			t.Fatal(err)
		}
		got, err := kubeletcompat.ParseCrictl([]byte(out.String()))
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, out.String())
		}
		if len(got) != tc.want || got[0].Hash != "1575786e" || got[0].Pod != "web-0" || got[0].StartedAt.IsZero() {
			t.Errorf("crictl %v: %+v", tc.args, got)
		}
		if len(got) == 1 && (got[0].ID != ids["app"] || !got[0].Running) {
			t.Errorf("crictl ps lists %+v, want only the running app %s", got[0], ids["app"])
		}
	}
	if err := Crictl(ctx, endpoint, []string{"images"}, io.Discard); err == nil {
		t.Error("an unsupported subcommand is accepted")
	}
}
