// Package sandbox owns one pod's sandbox inside the shim: the containerd sandbox API
// (CreateSandbox ... ShutdownSandbox), the pause process, the pod cgroup and sandbox.json.
// It must not touch networking beyond joining the netns it is given, nor import Kubernetes.
package sandbox
