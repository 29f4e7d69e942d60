// Command upgrade runs inside the air gap: it verifies and imports kubelift
// bundles into the private registry, stages their binaries on the nodes,
// plans, and upgrades the cluster in place.
package main

import "github.com/kubelift/kubelift/internal/cli"

func main() { cli.Main(newRootCmd) }
