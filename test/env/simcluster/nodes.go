package simcluster

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Node is a simulated node.
type Node struct {
	// Name is the Node's name.
	Name string
	// Address is its InternalIP (where kubelift's SSH fleet serves it).
	Address string
	// ControlPlane nodes get node-role.kubernetes.io/control-plane="".
	ControlPlane bool
	// KubeletVersion is status.nodeInfo.kubeletVersion ("v1.30.14").
	KubeletVersion string
	// Labels are added to the usual ones.
	Labels map[string]string
}

// creators bounds the parallel creates of AddNodes and AddPods.
const creators = 32

// AddNodes creates the Nodes, as kubelets register them (labels,
// addresses, node info and capacity), and waits until KWOK made them all
// Ready.
func (c *Cluster) AddNodes(ctx context.Context, nodes []Node) error {
	start := time.Now()
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	base := len(c.nodes)
	err := parallel(ctx, len(nodes), func(ctx context.Context, i int) error {
		node := nodeObject(nodes[i], base+i)
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("node %s: %w", node.Name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.nodes = append(c.nodes, names...)
	c.o.Log("simcluster: %d nodes created in %s", len(nodes), time.Since(start).Round(time.Millisecond))
	if err := c.waitFor(ctx, c.nodeInf, "nodes Ready", names, func(obj any) bool {
		n, ok := obj.(*corev1.Node)
		return ok && NodeReady(n)
	}); err != nil {
		return err
	}
	c.o.Log("simcluster: %d nodes Ready in %s", len(nodes), time.Since(start).Round(time.Millisecond))
	return nil
}

// NodeReady reports whether the Node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeObject is the Node the i-th node's kubelet would register.
func nodeObject(n Node, i int) *corev1.Node {
	labels := map[string]string{
		"kubernetes.io/hostname":  n.Name,
		"kubernetes.io/os":        "linux",
		"kubernetes.io/arch":      "amd64",
		"beta.kubernetes.io/os":   "linux",
		"beta.kubernetes.io/arch": "amd64",
	}
	if n.ControlPlane {
		labels["node-role.kubernetes.io/control-plane"] = ""
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels},
		// A /24 of its own for each node's pod IPs (KWOK allocates from
		// it), as the controller-manager's IPAM would give.
		Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", 128+i/256%128, i%256)},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: n.Address},
				{Type: corev1.NodeHostName, Address: n.Name},
			},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion:          n.KubeletVersion,
				KubeProxyVersion:        n.KubeletVersion,
				ContainerRuntimeVersion: "containerd://1.7.22",
				OperatingSystem:         "linux",
				Architecture:            "amd64",
				OSImage:                 "Debian GNU/Linux 12 (bookworm)",
				KernelVersion:           "6.1.0-kwok",
			},
			Capacity:    capacity,
			Allocatable: capacity,
		},
	}
}

// parallel runs f for 0..n-1 on a bounded number of goroutines and
// returns the first error (the others stop taking work).
func parallel(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(creators, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := f(ctx, i); err != nil {
					cancel(err)
				}
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		select {
		case work <- i:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}

// waitFor waits until ok holds for every named object of the informer
// (by its store key), watching rather than listing again, and reports
// progress every 10 s.
func (c *Cluster) waitFor(ctx context.Context, inf cache.SharedIndexInformer, what string, keys []string, ok func(obj any) bool) error {
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	var mu sync.Mutex
	good := map[string]bool{}
	done := make(chan struct{})
	closed := false
	see := func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil || !want[key] {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if ok(obj) {
			good[key] = true
		} else {
			delete(good, key)
		}
		if len(good) == len(want) && !closed {
			closed = true
			close(done)
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    see,
		UpdateFunc: func(_, obj any) { see(obj) },
		DeleteFunc: func(obj any) {
			if d, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
				obj = d.Obj
			}
			key, _ := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
			mu.Lock()
			delete(good, key)
			mu.Unlock()
		},
	})
	if err != nil {
		return err
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	if len(want) == 0 {
		return nil
	}
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	missing := func() string {
		mu.Lock()
		defer mu.Unlock()
		var m []string
		for k := range want {
			if !good[k] {
				m = append(m, k)
			}
		}
		sort.Strings(m)
		n := len(m)
		if n > 5 {
			m = append(m[:5], fmt.Sprintf("and %d more", n-5))
		}
		return fmt.Sprintf("%d/%d %s (waiting for %v)", len(want)-n, len(want), what, m)
	}
	for {
		select {
		case <-done:
			return nil
		case <-tick.C:
			if err := c.exited(); err != nil {
				return err
			}
			c.o.Log("simcluster: %s", missing())
		case <-ctx.Done():
			if err := c.exited(); err != nil {
				return err
			}
			return fmt.Errorf("%s: %w", missing(), context.Cause(ctx))
		}
	}
}
