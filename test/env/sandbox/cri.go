package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// ServeCRI serves the container-runtime stand-in on endpoint until ctx
// ends: a CRI gRPC server (k8s.io/cri-client/pkg/fake, as kubemark uses)
// that runs no processes; containers are records that keep their
// annotations (the kubelet's spec hashes), so restarting the kubelet does
// not restart them, as with containerd. imageSize is reported for every
// image (the kubelet rejects size 0).
func ServeCRI(ctx context.Context, endpoint string, imageSize uint64) error {
	rt := &criRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime()}
	rt.ImageService.SetFakeImageSize(imageSize)
	rt.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true}, {Type: kubeapi.NetworkReady, Status: true}}}
	l, err := util.CreateListener(endpoint)
	if err != nil {
		return fmt.Errorf("CRI stand-in on %s: %w", endpoint, err)
	}
	srv := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(srv, rt)
	kubeapi.RegisterImageServiceServer(srv, rt)
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	return srv.Serve(l)
}

// criRuntime is the fake with one thing a real runtime does and the fake
// does not: a container's status carries its log path (the pod's log
// directory joined with the container's), and the file exists. With an
// empty log path the kubelet's log cleanup globs "*" in its working
// directory and removes what it finds there (seen: /bin on the host, from
// a kubelet whose working directory was /).
type criRuntime struct {
	*fake.RemoteRuntime
}

func (r *criRuntime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	logPath := ""
	if dir, rel := req.GetSandboxConfig().GetLogDirectory(), req.GetConfig().GetLogPath(); dir != "" && rel != "" {
		logPath = filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err == nil {
			if f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY, 0o640); err == nil {
				f.Close()
			}
		}
	}
	r.RuntimeService.Lock()
	if c := r.RuntimeService.Containers[resp.ContainerId]; c != nil {
		c.LogPath = logPath
	}
	r.RuntimeService.Unlock()
	return resp, nil
}

// StopContainer ends the container as a process that SIGTERM ends does
// under containerd: exit code 143, reason "Error" (the fake's exit code 0
// would make every stopped pod "Succeeded").
func (r *criRuntime) StopContainer(ctx context.Context, req *kubeapi.StopContainerRequest) (*kubeapi.StopContainerResponse, error) {
	resp, err := r.RemoteRuntime.StopContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	r.RuntimeService.Lock()
	if c := r.RuntimeService.Containers[req.ContainerId]; c != nil && c.ExitCode == 0 {
		c.ExitCode, c.Reason = 143, "Error"
	}
	r.RuntimeService.Unlock()
	return resp, nil
}
