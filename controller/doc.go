// Package controller is crisp's sandbox controller: it keeps each pod's record (the
// store), owns the pod's network namespace and CNI, orchestrates the pod's lifecycle
// (create, stop, remove, a dead shim's reaping, warm spares, recovery after a restart)
// and the containers' task API calls. It is the only package that speaks to shims; it
// must not know the CRI's types.
//
// A pod's sandbox is reached through containerd's sandbox API
// (sandboxapi.TTRPCSandboxService), served by one of two sandboxers, chosen by the
// handler's sandbox_mode when the controller connects to the pod's shim (connect):
//
//   - sandbox (the default): crisp's own shim (package shim, binary shim-runc) serves
//     the sandbox API itself; the controller starts it through the runtime-v2
//     bootstrap (shim.go) and talks to it over ttrpc.
//   - task: any containerd runtime-v2 shim that serves only the task API
//     (containerd-shim-runc-v2, gVisor's containerd-shim-runsc-v1). Package
//     tasksandbox serves the sandbox API on top of it, in criserver, as containerd's
//     podsandbox does, and owns everything such a shim needs from criserver: the
//     pause container, runtime options, FIFO I/O and CRI logs, attach, the shim's log,
//     the cleanup after a dead shim. taskonly.go is what the controller hands it.
package controller
