package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubelift/kubelift/internal/agent"
	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/controller"
	"github.com/kubelift/kubelift/internal/upgradeapi"
)

// TestControllerOnARealAPIServer installs the controller's resource and
// rights on a real kube-apiserver and acts as the controller (its
// service account, by impersonation): the API server checks the
// Upgrade's schema and prints its columns; the controller's role lets
// it read Upgrades and write their status, not their spec nor the
// cluster's Secrets; two replicas elect one leader, and the other takes
// over when it stops; the leader runs an Upgrade to its end.
func TestControllerOnARealAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := startAPIServer(ctx, t)
	admin := kubernetes.NewForConfigOrDie(cfg)
	cat, err := catalog.Load("")
	if err != nil {
		t.Fatal(err)
	}
	in := controller.Install{Image: "registry.test/kubelift-agent@sha256:" + strings.Repeat("a", 64), Replicas: 2, Domain: "registry.test",
		Username: "admin", Password: "s3cret", Key: []byte("-----BEGIN PUBLIC KEY-----\n"), Catalog: cat}
	for range 2 { // made again, it is the same
		if err := in.Apply(ctx, admin, dynamic.NewForConfigOrDie(cfg)); err != nil {
			t.Fatal(err)
		}
	}
	d, err := admin.AppsV1().Deployments(agent.Namespace).Get(ctx, controller.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := d.Spec.Template.Spec.Containers[0]; c.Image != in.Image || !slices.Contains(c.Args, "--key") || *d.Spec.Replicas != 2 {
		t.Errorf("deployment: image %s args %v replicas %d", c.Image, c.Args, *d.Spec.Replicas)
	}

	// As the controller.
	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + agent.Namespace + ":" + controller.Name}
	kubeAs := kubernetes.NewForConfigOrDie(as)
	dynAs := dynamic.NewForConfigOrDie(as)
	upgrades := upgradeapi.Client{Dynamic: dynamic.NewForConfigOrDie(cfg)}

	// The schema refuses what is not a version.
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kubelift.dev/v1alpha1", "kind": "Upgrade",
		"metadata": map[string]any{"name": "bad"}, "spec": map[string]any{"version": "1.31", "window": map[string]any{"start": "25:00", "end": "04:00"}}}}
	_, err = upgrades.Dynamic.Resource(upgradeapi.Resource).Create(ctx, bad, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.version") || !strings.Contains(err.Error(), "spec.window.start") {
		t.Fatalf("an Upgrade to 1.31 with a window from 25:00: %v, want refused naming spec.version and spec.window.start", err)
	}
	u, err := upgrades.Create(ctx, &upgradeapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: "v1.31.4"}, Spec: upgradeapi.Spec{Version: "v1.31.4", MaxUnavailable: "25%"}})
	if err != nil {
		t.Fatal(err)
	}

	// The controller's rights: Upgrades' status, not their spec; not
	// the Secrets of kube-system; no Node deleted.
	asUpgrades := upgradeapi.Client{Dynamic: dynAs}
	u.Spec.Paused = true
	if _, err := asUpgrades.Update(ctx, u); !apierrors.IsForbidden(err) {
		t.Errorf("the controller changed an Upgrade's spec: %v", err)
	}
	u.Spec.Paused = false
	u.Status.Phase = upgradeapi.Pending
	if _, err := asUpgrades.UpdateStatus(ctx, u); err != nil {
		t.Errorf("the controller may not write an Upgrade's status: %v", err)
	}
	if _, err := kubeAs.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller listed kube-system's Secrets: %v", err)
	}
	if err := kubeAs.CoreV1().Nodes().Delete(ctx, "any", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller may delete Nodes: %v", err)
	}
	// What the run does, allowed; what it does not, refused.
	for _, tc := range []struct {
		attrs   authorizationv1.ResourceAttributes
		allowed bool
	}{
		{authorizationv1.ResourceAttributes{Verb: "patch", Resource: "nodes"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Resource: "nodes"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Subresource: "eviction", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "patch", Resource: "pods", Namespace: "shop"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Resource: "pods", Namespace: "kube-system"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Resource: "configmaps", Namespace: "kube-system"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Resource: "services", Namespace: "kube-system", Name: "kube-dns"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "apps", Resource: "deployments", Namespace: "kube-system", Name: "coredns"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "apps", Resource: "deployments", Namespace: "kube-system", Name: "metrics-server"}, false},
		{authorizationv1.ResourceAttributes{Verb: "patch", Group: "apps", Resource: "daemonsets", Namespace: "kube-system", Name: "kube-proxy"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system", Name: "kubelift-upgrade"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system", Name: "kube-scheduler"}, false},
		{authorizationv1.ResourceAttributes{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices", Namespace: "default"}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-node-lease", Name: "worker-1"}, true},
		{authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-node-lease", Name: "worker-1"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Resource: "secrets", Namespace: agent.Namespace}, true},
		{authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: "shop"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"}, false},
	} {
		r, err := kubeAs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &tc.attrs}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed != tc.allowed {
			t.Errorf("the controller %s %s/%s %s in %q: allowed %v, want %v", tc.attrs.Verb, tc.attrs.Resource, tc.attrs.Subresource, tc.attrs.Name, tc.attrs.Namespace, r.Status.Allowed, tc.allowed)
		}
	}

	// Two replicas: one leads and runs the Upgrade; stopped, it keeps
	// the Lease until its run has stopped, then releases it, and the
	// other takes over at once.
	ran := make(chan string, 4)
	stopping, letStop := make(chan struct{}), make(chan struct{})
	var firstStopped atomic.Bool
	replica := func(name string) (context.CancelFunc, <-chan error) {
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		c := &controller.Controller{Upgrades: asUpgrades, Kube: kubeAs, Identity: name, Poll: 50 * time.Millisecond,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Run: func(ctx context.Context, r controller.Run) (controller.Outcome, error) {
				if name == "second" && !firstStopped.Load() {
					t.Error("second ran while first's run was still stopping")
				}
				ran <- name
				if name == "first" {
					<-ctx.Done() // runs until it stops leading
					close(stopping)
					<-letStop // a run takes a while to stop
					firstStopped.Store(true)
					return controller.Outcome{}, ctx.Err()
				}
				if err := r.Hold(ctx, "worker-1"); err != nil {
					return controller.Outcome{}, err
				}
				return controller.Outcome{From: "v1.30.14", To: "v1.31.4"}, nil
			}}
		go func() {
			done <- controller.Lead(rctx, kubeAs, agent.Namespace, name, func(ctx context.Context) { _ = c.Reconcile(ctx) })
		}()
		return stop, done
	}
	stopFirst, firstDone := replica("first")
	if got := <-ran; got != "first" {
		t.Fatalf("%s ran first", got)
	}
	stopSecond, secondDone := replica("second")
	defer func() { stopSecond(); <-secondDone }()
	leader := func() string {
		l, err := admin.CoordinationV1().Leases(agent.Namespace).Get(ctx, controller.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return fmt.Sprint(err)
		}
		return *l.Spec.HolderIdentity
	}
	if l := leader(); l != "first" {
		t.Fatalf("the lease is held by %s, want first", l)
	}
	stopFirst()
	<-stopping
	// first's run is stopping: the Lease stays first's, second waits.
	for range 3 {
		time.Sleep(controller.RetryPeriod / 2) // second tries the Lease every RetryPeriod
		if l := leader(); l != "first" {
			t.Fatalf("the lease went to %s while first's run was stopping", l)
		}
	}
	close(letStop)
	if err := <-firstDone; err == nil || ctx.Err() != nil {
		t.Fatalf("the stopped replica: %v", err)
	}
	select {
	case got := <-ran:
		if got != "second" {
			t.Fatalf("%s ran after first stopped", got)
		}
	case <-ctx.Done():
		t.Fatalf("second never ran the upgrade: the lease is held by %s", leader())
	}
	for {
		u, err = upgrades.Get(ctx, "v1.31.4")
		if err != nil {
			t.Fatal(err)
		}
		if u.Status.Phase == upgradeapi.Complete {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the upgrade never completed: %+v", u.Status)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if u.Status.Controller != "second" || u.Status.ObservedGeneration != u.Generation || u.Status.From != "v1.30.14" {
		t.Errorf("completed: %+v", u.Status)
	}

	// kubectl get upgrades: the API server's Table has the columns.
	var table metav1.Table
	err = admin.CoreV1().RESTClient().Get().AbsPath("/apis", upgradeapi.Group, upgradeapi.Version, "upgrades").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(&table)
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, c.Name)
	}
	if len(table.Rows) != 1 || !slices.Contains(cols, "Phase") || fmt.Sprint(table.Rows[0].Cells[:3]) != "[v1.31.4 v1.31.4 Complete]" {
		t.Errorf("kubectl get upgrades: columns %v, rows %v", cols, table.Rows)
	}
}
