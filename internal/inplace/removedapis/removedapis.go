// Package removedapis finds what in a cluster uses an API version a
// release stops serving: the resources served under it, and each object
// last written through it (its managedFields, or kubectl apply's
// annotation), by which writer. The plan turns what it finds into
// findings (preflight's removed-apis check).
package removedapis

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
)

// MaxObjects bounds the objects one removed resource lists.
const MaxObjects = 50000

// Resource is one resource served under a removed API version, and what
// uses it.
type Resource struct {
	// Name is the resource's (flowschemas); Object names it as findings
	// do: api/GROUP/VERSION/NAME.
	Name, Object string
	// Listed: its objects were listed (a dynamic client was given and
	// the list did not fail: ListErr says why it did). Count is how many.
	Listed  bool
	ListErr error
	Count   int
	// Written are the objects last written through the removed version.
	Written []Written
}

// Written is an object last written through a removed version: its
// name (RESOURCE.GROUP/[NAMESPACE/]NAME) and the field manager that
// wrote it ("kubectl apply" for the annotation).
type Written struct{ Name, Manager string }

// Find lists the resources the cluster serves under api's group-version
// and, with dyn, the objects of each written through it: none where the
// version is not served at all.
func Find(ctx context.Context, disc discovery.DiscoveryInterface, dyn dynamic.Interface, api catalog.RemovedAPI) []Resource {
	gvs := api.GroupVersion()
	rl, err := disc.ServerResourcesForGroupVersion(gvs)
	if err != nil {
		return nil // not served: nothing uses it
	}
	var out []Resource
	for _, r := range rl.APIResources {
		if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || (api.Resource != "" && r.Name != api.Resource) {
			continue
		}
		res := Resource{Name: r.Name, Object: "api/" + gvs + "/" + r.Name}
		if dyn != nil {
			res.list(ctx, dyn.Resource(schema.GroupVersionResource{Group: api.Group, Version: api.Version, Resource: r.Name}), api, gvs)
		}
		out = append(out, res)
	}
	return out
}

// list counts the resource's objects, at most MaxObjects, and notes
// those written through gvs.
func (res *Resource) list(ctx context.Context, ri dynamic.ResourceInterface, api catalog.RemovedAPI, gvs string) {
	opts := cluster.ListOptions()
	for res.Count < MaxObjects {
		l, err := ri.List(ctx, opts)
		if err != nil {
			res.ListErr = err
			return
		}
		for i := range l.Items {
			res.Count++
			u := &l.Items[i]
			manager, ok := writtenThrough(u, gvs)
			if !ok {
				continue
			}
			name := res.Name + "." + api.Group + "/" + u.GetName()
			if u.GetNamespace() != "" {
				name = res.Name + "." + api.Group + "/" + u.GetNamespace() + "/" + u.GetName()
			}
			res.Written = append(res.Written, Written{Name: name, Manager: manager})
		}
		if opts.Continue = l.GetContinue(); opts.Continue == "" {
			break
		}
	}
	res.Listed = true
}

// writtenThrough reports whether an object was last written through
// group-version gv, and by which field manager: its managedFields name the
// API version each manager used, and a kubectl apply's annotation the
// manifest's apiVersion.
func writtenThrough(u *unstructured.Unstructured, gv string) (string, bool) {
	for _, mf := range u.GetManagedFields() {
		if mf.APIVersion == gv {
			return mf.Manager, true
		}
	}
	if last := u.GetAnnotations()[corev1.LastAppliedConfigAnnotation]; last != "" {
		var m struct {
			APIVersion string `json:"apiVersion"`
		}
		if json.Unmarshal([]byte(last), &m) == nil && m.APIVersion == gv {
			return "kubectl apply", true
		}
	}
	return "", false
}
