// Package tasksandbox is crisp's task-only sandboxer: it runs a pod on any containerd
// runtime-v2 shim that serves only the task API (containerd-shim-runc-v2, gVisor's
// containerd-shim-runsc-v1, containerd 1.x shims with task v2), the way containerd's
// podsandbox does. The sandbox is a pause container the shim runs like any other
// (PauseBundle, with the handler's runtime options from RuntimeOptions); Sandbox
// serves containerd's sandbox API (sandboxapi.TTRPCSandboxService) on top of the
// shim's task API, so the controller drives a pod on such a shim through the same
// interface as a pod on crisp's own shim, which serves the sandbox API itself.
//
// Such a shim knows nothing of CRI logs: criserver makes each container's stdio FIFOs,
// copies their output into the CRI log (package crilog) and serves attach from that
// copy (IO, Sandboxer.OpenIO, Sandboxer.Attach), and resumes the copy after a restart
// from the io.json it leaves in the container's bundle. It also reads the shim's own
// log FIFO (ShimLog), records the shim's start answer (WriteBootstrap), and cleans up
// where the shim cannot: after the shim died (CleanDeadShim, one `shim delete` per
// container, then the pause), after a create cut short (`runc delete` and empty
// cgroups), and the socket of a start cut short.
//
// The controller keeps the pod's record, its network, its lifecycle and the choice of
// sandboxer; it hands this package a Pod and, for the shim binary's delete, a
// ShimBinary. This package never imports the controller, the CRI or crisp's shim.
//
// It stands at the top level, beside shim/ (crisp's own sandboxer, a binary of its
// own), rather than under controller/: the two sandboxers are peers behind one
// interface, and the repository keeps one package per concern at the top (crilog,
// fifoio, netns, network) with the controller importing them, not owning them.
package tasksandbox
