package kube

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A container the kubelet removed between ListContainers and its
// ContainerStatus is gone, not an error: NotFound from a runtime, or the
// CRI stand-in's plain "container ... not found" (FC20's e2e failure);
// any other error stays one.
func TestRemovedSinceListed(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{status.Error(codes.NotFound, "an error occurred when try to find container"), true},
		{status.Error(codes.Unknown, `container "a-0_default_uid_0_sidecar_0" not found`), true},
		{status.Error(codes.Unavailable, "connection refused"), false},
		{status.Error(codes.Unknown, `pod sandbox "x" not found`), false},
		{errors.New("EOF"), false},
	} {
		if got := removedSinceListed(tc.err); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
}
