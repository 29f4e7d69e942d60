package sandbox

import (
	"context"
	"fmt"

	"k8s.io/cri-client/pkg/fake"
)

// ServeCRI serves the container-runtime stand-in on endpoint until ctx
// ends: a CRI gRPC server (k8s.io/cri-client/pkg/fake, as kubemark uses)
// that runs no processes; containers are records that keep their
// annotations (the kubelet's spec hashes), so restarting the kubelet does
// not restart them, as with containerd. imageSize is reported for every
// image (the kubelet rejects size 0).
func ServeCRI(ctx context.Context, endpoint string, imageSize uint64) error {
	rt := fake.NewFakeRemoteRuntime()
	rt.ImageService.SetFakeImageSize(imageSize)
	if err := rt.Start(endpoint); err != nil {
		return fmt.Errorf("CRI stand-in on %s: %w", endpoint, err)
	}
	<-ctx.Done()
	rt.Stop()
	return nil
}
