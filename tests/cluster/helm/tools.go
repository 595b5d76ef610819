//go:build tools

// Package helm only exists to keep the Helm command the chart tests build in
// this module's requirements (the usual tools.go pattern). It is never
// compiled; tests/chart/helm_binary.py runs `go build helm.sh/helm/v3/cmd/helm`
// here.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
