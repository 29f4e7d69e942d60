// Package inplace is kubelift's upgrade engine: it reads a cluster (the
// API and, over SSH, every node), stages a version's binaries on the
// nodes, and works out, before anything is touched, what an in-place
// upgrade will do: the ordered plan (control plane first, then kubelets in
// batches) and the findings that block or qualify it (skew and path,
// staging, health, removed flags and APIs, pods the restarted kubelet
// would reject, pods that could be evicted, containers that would
// restart).
//
// It never prints: progress goes through an injected logger, and results
// are values the commands render.
package inplace
