// Package manifests embeds kubelift's data: the version catalog
// (catalog.yaml) that says, per Kubernetes version, which images and
// binaries make it up and which upgrades are allowed.
package manifests

import _ "embed"

// Catalog is the built-in version catalog, in the schema read by
// internal/catalog.
//
//go:embed catalog.yaml
var Catalog []byte

// CatalogName names the built-in catalog in error messages.
const CatalogName = "built-in catalog (manifests/catalog.yaml)"
