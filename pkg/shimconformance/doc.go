// Package shimconformance checks a containerd runtime-v2 shim binary against the shim
// contract, capability by capability, with no containerd, no kubelet and no crisp
// runtime: it starts the shim itself (BootstrapParams on stdin, or the legacy flags and
// environment), drives its sandbox API (mode sandbox) or a podsandbox-like sandbox
// container (mode task) and the task API over ttrpc, receives its task events on a
// ttrpc Events server of its own, and reports each capability as pass, fail (with the
// reason) or unsupported (the shim answered Unimplemented, or the mode has no use for
// it).
//
// What it promises: capability names (Capabilities) are stable and only ever added;
// a check that fails, panics or times out never stops the others; whatever the suite
// makes (shim and container processes, rootfs mounts, the network namespace, the
// cgroups under /crisp-shimtest-<random>, sockets, FIFOs and bundles) is removed
// before Run returns. It needs root, a cgroupfs host and a busybox rootfs
// (Debian's busybox-static by default).
//
// Use Run from a program (cmd/crisp-shimtest is one) or RunT from a go test; the
// package imports only wire packages (containerd's API module, crisp's api/), never
// an implementation of a shim or a runtime. Licensed Apache-2.0 like the rest of crisp.
package shimconformance
