// Package sandbox owns one pod's sandbox inside crisp's shim: the kit's Pod (the
// sandbox API itself is pkg/shimkit/sandbox's) with the pause process, the pod cgroup,
// the pod's files and sandbox.json. It must not touch networking beyond joining the
// netns it is given, nor import Kubernetes.
package sandbox
