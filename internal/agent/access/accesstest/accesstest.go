// Package accesstest helps tests of agent mode's run side: a fake
// clientset that deletes collections (a run's end deletes its requests
// and pods in one request each).
package accesstest

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// DeleteCollections makes c delete collections of Secrets and Pods as
// an API server does (the fake answers them and deletes nothing): what
// the label selector and, for Secrets, the type field select.
func DeleteCollections(c *fake.Clientset) {
	c.PrependReactor("delete-collection", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.DeleteCollectionAction).GetListRestrictions()
		gvr := a.GetResource()
		kind := map[string]string{"secrets": "Secret", "pods": "Pod"}[gvr.Resource]
		list, err := c.Tracker().List(gvr, corev1.SchemeGroupVersion.WithKind(kind), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return true, nil, err
		}
		for _, it := range items {
			o := it.(metav1.Object)
			f := fields.Set{"metadata.name": o.GetName()}
			if s, ok := it.(*corev1.Secret); ok {
				f["type"] = string(s.Type)
			}
			if (r.Labels != nil && !r.Labels.Matches(labels.Set(o.GetLabels()))) || (r.Fields != nil && !r.Fields.Matches(f)) {
				continue
			}
			if err := c.Tracker().Delete(gvr, a.GetNamespace(), o.GetName()); err != nil && !strings.Contains(err.Error(), "not found") {
				return true, nil, err
			}
		}
		return true, nil, nil
	})
}
