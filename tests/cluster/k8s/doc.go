// Package k8s pins the Kubernetes release used by the cluster tests; see go.mod.
package k8s
