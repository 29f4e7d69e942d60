// Command bundle packages everything one Kubernetes version needs into one
// signed file, optionally a self-extracting .run installer, for carrying
// into an air gap.
package main

import "github.com/kubelift/kubelift/internal/cli"

func main() { cli.Main(newRootCmd) }
