// Package shimapi owns crisp's own ttrpc service on the shim socket, crisp.shim.v1.Shim:
// what the containerd task API does not carry (log reopening, OOM kills). It holds only
// the wire contract (service name, methods, client); the shim implements it.
package shimapi
