// Package shim owns the shim binary's modes: the containerd runtime-v2 `start` bootstrap,
// serving the ttrpc socket, `delete` of a dead shim and `-info`/version output.
// It must not hold pod logic (that is pkg/shimkit/pod) nor import Kubernetes packages.
package shim
