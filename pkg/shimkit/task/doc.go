// Package task is the kit's task service: containerd.task.v3.Task (and v2 on the same
// code) and crisp.shim.v1.Shim for the containers of one pod, over a Runner the
// sandboxer provides: stdio, terminals, CRI logs, attach, exits, OOM kills, stats and
// task events are the kit's. It must not touch the pod sandbox nor import a runtime.
package task
