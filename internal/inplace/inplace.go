// Package inplace is kubelift's upgrade engine, as cmd/ calls it: a
// thin facade over the rooms beneath it, where the work is done
// (docs/development.md, "The engine's rooms"). preflight reads a cluster
// and says what an upgrade will do and what stands in its way; stage puts
// a version's files on the nodes; runbook applies the upgrade in place,
// rolls it back, and resumes either, through the control-plane driver of
// the cluster's kind (driver/binary, driver/kubeadm); versions lists
// where a cluster can go; compat cleans up after an upgrade.
//
// It never prints: progress goes through an injected logger, and results
// are values the commands render.
package inplace
