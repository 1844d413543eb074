// Package daemon wires criserver together: directories, store, network, controller,
// the CRI service and its gRPC socket, the reload of its config on SIGHUP, and a clean
// shutdown that leaves pods running. It must not implement CRI semantics itself; those
// live in package cri.
package daemon
