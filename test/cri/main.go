// Command cri is the sandbox's stand-in container runtime: a CRI gRPC
// server on a unix socket (k8s.io/cri-client/pkg/fake, as kubemark uses)
// that a real kubelet and crictl talk to. It runs no processes; containers
// are records that keep their annotations (the kubelet's spec hashes), so
// restarting the kubelet does not restart them, as with containerd.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cri-client/pkg/fake"
)

func main() {
	endpoint := flag.String("endpoint", "unix:///run/kubelift/cri.sock", "CRI endpoint to serve")
	imageSize := flag.Uint64("image-size", 1<<20, "size reported for every image (the kubelet rejects size 0)")
	flag.Parse()
	rt := fake.NewFakeRemoteRuntime()
	rt.ImageService.SetFakeImageSize(*imageSize)
	if err := rt.Start(*endpoint); err != nil {
		fmt.Fprintln(os.Stderr, "cri:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "cri: serving", *endpoint)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	rt.Stop()
}
