package access

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubelift/kubelift/internal/agent/access/accesstest"
)

// newClient is a fake clientset that deletes collections as an API
// server does.
func newClient(objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	accesstest.DeleteCollections(c)
	return c
}
