// Package pod is the kit's standard Pod (pkg/shimkit/sandbox) for sandboxers whose
// containers are Linux processes: a built-in pause process holding the pod's
// namespaces (pkg/shimkit/pause), the pod cgroup, the pod's files under containerd's
// shim sandboxer, and sandbox.json for `delete` (Cleanup) and recovery. crisp's
// shim-runc runs on it. It must not touch networking beyond joining the netns it is
// given, nor import Kubernetes.
package pod
