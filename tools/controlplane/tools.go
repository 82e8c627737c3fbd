//go:build tools

// Package controlplane records the programs this module builds, so that go mod tidy keeps
// their dependencies.
package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
