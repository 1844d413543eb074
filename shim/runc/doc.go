// Package runc is crisp's runc runner: the task.Runner of pkg/shimkit that runs a pod's
// containers with libcontainer in short-lived task helpers (`shim-runc _task`), and the
// cleanup of a dead shim's containers. It must not touch the pause process or the pod
// cgroup (pkg/shimkit/pod) nor import Kubernetes or the CRI.
package runc
