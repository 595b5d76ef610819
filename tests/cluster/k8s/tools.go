//go:build tools

// Package k8s only exists to keep the Kubernetes commands the cluster and node tests
// build in this module's requirements (the usual tools.go pattern). It is never
// compiled; binaries.py runs `go build k8s.io/kubernetes/cmd/...` here.
package k8s

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
