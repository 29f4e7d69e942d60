package preflight

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/nodefacts"
)

// A rollback's preflight: the recorded upgrade it undoes, the cluster
// read as the plan reads it (every node reached, every value parsed),
// and whether the catalog still allows going back.

// ErrRollbackRefused means the upgrade can only go forward.
var ErrRollbackRefused = errors.New("rollback refused")

// RollbackAllowed says whether an upgrade from -> to may be rolled back
// now: while every API server runs from, or a version the catalog lists
// from among the patch downgrades of. An API server at another minor (at
// to, or at a hop on the way) has written to etcd what an older one may
// not read: the upgrade can only go forward. apiservers are the versions
// the control-plane nodes' API servers run.
func RollbackAllowed(cat *catalog.Catalog, from, to string, apiservers map[string]string) error {
	f, errF := catalog.ParseVersion(from)
	for _, node := range slices.Sorted(maps.Keys(apiservers)) {
		v := apiservers[node]
		if v == from || v == "" {
			continue
		}
		rel, errT := cat.Lookup(v)
		if errF == nil && errT == nil && rel.CanDowngradeTo(f) {
			continue
		}
		via := ""
		if v != to {
			via = fmt.Sprintf(" (a release on the way to %s)", to)
		}
		return fmt.Errorf("%w: kube-apiserver on %s runs %s already%s, and the catalog allows rollback after that only as a patch downgrade within a minor (%s lists %v): go forward (upgrade apply) instead",
			ErrRollbackRefused, node, v, via, v, downgrades(rel))
	}
	return nil
}

func downgrades(rel *catalog.Release) []string {
	if rel == nil {
		return nil
	}
	return rel.DowngradeTo
}

// ReadRollback reads the cluster for a rollback of from -> to: refused
// (ErrRollbackRefused) when a node cannot be reached or reported values
// that do not parse, or when RollbackAllowed refuses the API servers'
// versions; else the view and the nodes as they are now, for the driver.
func ReadRollback(ctx context.Context, p PlanOptions, from, to string) (*View, []NodeState, error) {
	v, err := readForRollback(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	apiservers, err := runningAPIServers(v)
	if err != nil {
		return nil, nil, err
	}
	if err := RollbackAllowed(p.Catalog, from, to, apiservers); err != nil {
		return nil, nil, err
	}
	return v, nodesAsTheyAre(v), nil
}

// RecordedUpgrade is the upgrade the cluster's record names, refused
// when there is none or its versions are not one version each.
func RecordedUpgrade(ctx context.Context, c kubernetes.Interface) (*record.Upgrade, error) {
	st, err := record.Read(ctx, c)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, fmt.Errorf("%w: no upgrade is recorded in this cluster", ErrRollbackRefused)
	}
	if fv, err := catalog.ParseVersion(st.From); err != nil || fv.String() != st.From {
		return nil, fmt.Errorf("%w: the recorded upgrade started from %q, not one version", ErrRollbackRefused, st.From)
	}
	if tv, err := catalog.ParseVersion(st.To); err != nil || tv.String() != st.To {
		return nil, fmt.Errorf("%w: the recorded upgrade went to %q, not a version", ErrRollbackRefused, st.To)
	}
	return st, nil
}

// readForRollback reads the cluster as plan does, refusing a node it
// cannot reach or one that reported values that do not parse: nothing is
// rolled back on those.
func readForRollback(ctx context.Context, p PlanOptions) (*View, error) {
	v, err := Read(ctx, p)
	if err != nil {
		return nil, err
	}
	for _, t := range v.Addresses {
		if e := v.SSH[t.Name]; e != nil {
			return nil, fmt.Errorf("%w: %w", ErrRollbackRefused, e)
		}
	}
	_, bad := nodefacts.KubeletVersions(v.Nodes)
	for _, t := range v.Addresses {
		if f := v.Facts[t.Name]; f != nil {
			bad = append(bad, f.Bad...)
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrRollbackRefused, nodefacts.Refused(bad))
	}
	return v, nil
}

// runningAPIServers is the version each node's API server runs: its
// unit's program, or on a kubeadm cluster (static pods) its mirror pod's
// image.
func runningAPIServers(v *View) (map[string]string, error) {
	apiservers := map[string]string{}
	for _, t := range v.Addresses {
		if f := v.Facts[t.Name]; f != nil && f.Components["kube-apiserver"] != "" {
			apiservers[t.Name] = f.Components["kube-apiserver"]
		}
	}
	if v.Kubeadm == nil {
		return apiservers, nil
	}
	for i := range v.Pods {
		if v.Pods[i].Namespace != metav1.NamespaceSystem {
			continue
		}
		comp, ver, err := StaticComponent(&v.Pods[i])
		if err != nil {
			return nil, fmt.Errorf("%w: node %s: %w", ErrRollbackRefused, v.Pods[i].Spec.NodeName, err)
		}
		if comp == "kube-apiserver" {
			apiservers[v.Pods[i].Spec.NodeName] = ver
		}
	}
	return apiservers, nil
}

// nodesAsTheyAre are the nodes now, for the driver: the parts each runs,
// and those it has a unit for but does not run (a part the run moved may
// be down: undoComponent reads its program).
func nodesAsTheyAre(v *View) []NodeState {
	var out []NodeState
	for _, t := range v.Addresses {
		ns := NodeState{Name: t.Name, Role: t.Role, Components: map[string]string{}}
		if f := v.Facts[t.Name]; f != nil {
			for c := range f.Units {
				ns.Components[c] = ""
			}
			for c, ver := range f.Components {
				if ver != "" {
					ns.Components[c] = ver
				}
			}
		}
		out = append(out, ns)
	}
	return out
}
