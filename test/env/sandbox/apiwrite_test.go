package sandbox

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// An API server whose first PATCH loses its connection (the load
// balancer closed it, FC27) and whose second answers: the sandbox's
// write makes the patch again and succeeds; a write the server refuses
// is not made again.
func TestWriteMakesAWriteAgainAfterALostConnection(t *testing.T) {
	var patches, refused atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/nodes/worker-1"):
			if patches.Add(1) == 1 {
				conn, _, err := w.(http.Hijacker).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				conn.Close()
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"worker-1"}}`))
		default:
			refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"nodes \"worker-9\" not found"}`))
		}
	}))
	defer api.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	patch := func(node string) func() error {
		return func() error {
			_, err := client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{})
			return err
		}
	}

	if err := write(ctx, "label node worker-1", patch("worker-1")); err != nil {
		t.Fatalf("write: %v", err)
	}
	if n := patches.Load(); n != 2 {
		t.Fatalf("the API server saw %d PATCHes of worker-1, want 2 (the lost one, then the one answered)", n)
	}

	err = write(ctx, "label node worker-9", patch("worker-9"))
	if err == nil || !strings.Contains(err.Error(), "label node worker-9") || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("a refused write: got %v, want its error naming the node", err)
	}
	if n := refused.Load(); n != 1 {
		t.Fatalf("a refused write was made %d times, want once", n)
	}
}
