// Package task owns the containers of one pod inside the shim: the containerd task API (v3,
// and v2 on the same code), crisp.shim.v1.Shim, libcontainer, stdio, CRI logs, exits and OOM.
// It must not touch the pod sandbox (pause process, pod cgroup) nor import Kubernetes.
package task
