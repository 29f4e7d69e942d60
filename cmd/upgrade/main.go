// Command upgrade runs inside the air gap: it verifies and imports kubelift
// bundles into the private registry and (as the engine lands) upgrades the
// cluster in place.
package main

import "github.com/kubelift/kubelift/internal/cli"

func main() { cli.Main(newRootCmd) }
