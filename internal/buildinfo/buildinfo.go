// Package buildinfo holds the version stamped into kubelift's programs at
// build time, so bundles can record which tool made them.
package buildinfo

import "runtime/debug"

// Version is set with -ldflags "-X github.com/kubelift/kubelift/internal/buildinfo.Version=...".
var Version = ""

// String returns the tool version: the stamped one, else the module version
// Go recorded, else "dev".
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
