// Command cri is the CRI stand-in (sandbox.ServeCRI) on its own, for tests
// that run a kubelet without the whole sandbox.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubelift/kubelift/test/env/sandbox"
)

func main() {
	endpoint := flag.String("endpoint", "unix:///run/kubelift/cri.sock", "CRI endpoint to serve")
	imageSize := flag.Uint64("image-size", 1<<20, "size reported for every image (the kubelet rejects size 0)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Fprintln(os.Stderr, "cri: serving", *endpoint)
	if err := sandbox.ServeCRI(ctx, *endpoint, *imageSize); err != nil {
		fmt.Fprintln(os.Stderr, "cri:", err)
		os.Exit(1)
	}
}
