// Package versions lists the versions a cluster can be at or go to: the
// catalog's and the imported ones, each with its state computed from what
// the nodes and the API server run (`upgrade versions`).
package versions

import (
	"context"
	"fmt"
	"sort"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
)

// Version states, computed from what the nodes run (StarlingX's
// kube-version-list).
const (
	StateActive      = "active"      // every node runs it
	StatePartial     = "partial"     // some nodes run it
	StateAvailable   = "available"   // imported, and the upgrade rules allow it from here
	StateImported    = "imported"    // imported, but not reachable from here
	StateUnavailable = "unavailable" // in the catalog only: import its bundle first
)

// State is one version of the catalog or the cluster's records.
type State struct {
	Version string `json:"version"`
	State   string `json:"state"`
	// Target marks the version the cluster is at, or heading for.
	Target bool `json:"target"`
	// Nodes counts the nodes whose kubelet runs it.
	Nodes int `json:"nodes"`
	// Imported names the cluster record of the version.
	Imported string `json:"imported,omitempty"`
	// Withdrawn is the catalog's word.
	Withdrawn bool `json:"withdrawn,omitempty"`
}

// List lists the catalog's versions and the cluster's imported ones,
// each with its state computed from what the nodes run now: the kubelet
// version each Node reports and the API server's own version.
func List(ctx context.Context, c kubernetes.Interface, cat *catalog.Catalog) ([]State, error) {
	nodes, err := cluster.ListNodes(ctx, c)
	if err != nil {
		return nil, err
	}
	info, err := c.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("API server version: %w", err)
	}
	apiserver, err := catalog.ParseVersion(info.GitVersion)
	if err != nil {
		return nil, fmt.Errorf("API server version %q: %w", info.GitVersion, err)
	}
	records, err := cluster.ListAvailable(ctx, c)
	if err != nil {
		return nil, err
	}
	running := map[string]int{}
	for _, n := range nodes {
		if v, err := catalog.ParseVersion(n.Status.NodeInfo.KubeletVersion); err == nil {
			running[v.String()]++
		}
	}
	out := map[string]*State{}
	get := func(v string) *State {
		if out[v] == nil {
			out[v] = &State{Version: v, State: StateUnavailable}
		}
		return out[v]
	}
	for _, r := range cat.Versions {
		get(r.Version).Withdrawn = r.Withdrawn
	}
	for _, r := range records {
		get(r.KubernetesVersion).Imported = cluster.RecordName(r.KubernetesVersion, r.BundleDigest)
	}
	for v, n := range running {
		get(v).Nodes = n
	}
	get(apiserver.String())
	for _, s := range out {
		v, err := catalog.ParseVersion(s.Version)
		if err != nil {
			continue
		}
		switch {
		case s.Nodes == len(nodes) && len(nodes) > 0 && v == apiserver:
			s.State, s.Target = StateActive, true
		case s.Nodes > 0 || v == apiserver:
			s.State = StatePartial
		case s.Imported != "":
			s.State = StateImported
			if reachable(cat, v, apiserver) {
				s.State = StateAvailable
			}
		}
	}
	list := make([]State, 0, len(out))
	for _, s := range out {
		list = append(list, *s)
	}
	sort.Slice(list, func(i, j int) bool {
		a, _ := catalog.ParseVersion(list[i].Version)
		b, _ := catalog.ParseVersion(list[j].Version)
		return a.Compare(b) < 0
	})
	// Mid-upgrade nothing is active everywhere: the newest running version
	// is where the cluster is heading.
	hasTarget := false
	for _, s := range list {
		hasTarget = hasTarget || s.Target
	}
	for i := len(list) - 1; i >= 0 && !hasTarget; i-- {
		if list[i].State == StatePartial {
			list[i].Target, hasTarget = true, true
		}
	}
	return list, nil
}

// reachable says whether the catalog allows moving the API server from
// cur to v: an upgrade v lists as a source, or an allowed patch downgrade.
func reachable(cat *catalog.Catalog, v, cur catalog.Version) bool {
	if v.Compare(cur) > 0 {
		rel, err := cat.Lookup(v.String())
		return err == nil && !rel.Withdrawn && rel.CanUpgradeFrom(cur)
	}
	rel, err := cat.Lookup(cur.String())
	return err == nil && rel.CanDowngradeTo(v)
}
