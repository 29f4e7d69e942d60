package cluster

import (
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestTransient(t *testing.T) {
	cm := schema.GroupResource{Resource: "configmaps"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewInternalError(errors.New("etcdserver: leader changed")), true},
		{apierrors.NewInternalError(errors.New("etcdserver: request timed out, possibly due to previous leader failure")), true},
		{apierrors.NewServerTimeout(cm, "update", 1), true},
		{apierrors.NewTooManyRequests("slow down", 1), true},
		{apierrors.NewServiceUnavailable("starting"), true},
		{fmt.Errorf("put: %w", syscall.ECONNREFUSED), true},
		{fmt.Errorf("put: %w", syscall.ECONNRESET), true},
		{io.ErrUnexpectedEOF, true},
		{nil, false},
		{apierrors.NewInternalError(errors.New("admission webhook \"x\" failed")), false},
		{apierrors.NewConflict(cm, "kubelift-upgrade", nil), false},
		{apierrors.NewForbidden(cm, "kubelift-upgrade", errors.New("no")), false},
		{apierrors.NewNotFound(cm, "kubelift-upgrade"), false},
		{errors.New("state.json: bad"), false},
	} {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("Transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
