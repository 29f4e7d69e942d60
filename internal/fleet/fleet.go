// Package fleet surveys several clusters at once (a kubelift config's
// contexts): per cluster the version its API server and kubelets run,
// the upgrade its record holds (target, state, when it last moved), and
// why a cluster could not be read, without one slow cluster holding the
// others.
package fleet

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubelift/kubelift/internal/catalog"
	"github.com/kubelift/kubelift/internal/cluster"
	"github.com/kubelift/kubelift/internal/inplace/record"
)

// Row is one cluster.
type Row struct {
	Context string `json:"context"`
	// APIServer is the version its API server says it runs; Kubelets the
	// oldest and newest its Nodes report ("v1.30.14" when one).
	APIServer string `json:"apiServer,omitempty"`
	Kubelets  string `json:"kubelets,omitempty"`
	Nodes     int    `json:"nodes"`
	// Target, State and LastRun are its record's (none when no upgrade
	// ran there).
	Target  string    `json:"target,omitempty"`
	State   string    `json:"state,omitempty"`
	LastRun time.Time `json:"lastRun,omitzero"`
	Error   string    `json:"error,omitempty"`
}

// Timeout bounds one cluster's survey.
const Timeout = 20 * time.Second

// parallel clusters are read at once.
const parallel = 8

// Survey reads each named cluster through the client connect makes of
// it, at most parallel at a time; rows come sorted by name.
func Survey(ctx context.Context, names []string, connect func(name string) (kubernetes.Interface, error)) []Row {
	rows := make([]Row, len(names))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rows[i] = survey(ctx, name, connect)
		}()
	}
	wg.Wait()
	sort.Slice(rows, func(i, j int) bool { return rows[i].Context < rows[j].Context })
	return rows
}

func survey(ctx context.Context, name string, connect func(string) (kubernetes.Interface, error)) Row {
	row := Row{Context: name}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	c, err := connect(name)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	nodes, err := cluster.ListNodes(ctx, c)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	row.Nodes = len(nodes)
	var lo, hi catalog.Version
	for i, n := range nodes {
		v, err := catalog.ParseReported(n.Status.NodeInfo.KubeletVersion)
		if err != nil {
			row.Error = fmt.Sprintf("node %s: kubeletVersion %q: %v", n.Name, n.Status.NodeInfo.KubeletVersion, err)
			return row
		}
		if i == 0 || v.Compare(lo) < 0 {
			lo = v
		}
		if i == 0 || hi.Compare(v) < 0 {
			hi = v
		}
	}
	switch {
	case len(nodes) == 0:
	case lo == hi:
		row.Kubelets = lo.String()
	default:
		row.Kubelets = lo.String() + " to " + hi.String()
	}
	if v, err := c.Discovery().ServerVersion(); err == nil {
		row.APIServer = v.GitVersion
	}
	u, err := record.Read(ctx, c)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	if u != nil {
		row.Target, row.State, row.LastRun = u.To, u.State, u.Updated
	}
	return row
}
