// Package task owns the containers of one pod inside the shim: the containerd task API (v3,
// and v2 on the same code), crisp.shim.v1.Shim, stdio, CRI logs, exits and OOM, and the
// short-lived task helper (`shim-runc _task`) that runs libcontainer for the shim.
// It must not touch the pod sandbox (pause process, pod cgroup) nor import Kubernetes.
package task
