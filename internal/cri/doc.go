// Package cri serves the CRI (k8s.io/cri-api runtime.v1): it validates requests, keeps
// the CRI's view of pods in the store, and maps CRI config onto controller calls. It
// must not talk to shims or libcontainer itself: that is the controller's job.
package cri
