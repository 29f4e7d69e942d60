// Package manifests embeds kubelift's data: the version catalog
// (catalog.yaml) that says, per Kubernetes version, which images and
// binaries make it up and which upgrades are allowed; and the Upgrade
// custom resource's definition (upgrade-crd.yaml).
package manifests

import _ "embed"

// Catalog is the built-in version catalog, in the schema read by
// internal/catalog.
//
//go:embed catalog.yaml
var Catalog []byte

// CatalogName names the built-in catalog in error messages.
const CatalogName = "built-in catalog (manifests/catalog.yaml)"

// UpgradeCRD is the CustomResourceDefinition of kubelift.dev's Upgrade
// (internal/upgradeapi), which `upgrade controller install` applies.
//
//go:embed upgrade-crd.yaml
var UpgradeCRD []byte
