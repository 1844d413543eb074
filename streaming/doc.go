// Package streaming owns criserver's streaming HTTP server: the SPDY and websocket
// endpoints behind the URLs that the CRI Exec, Attach and PortForward calls return.
//
// It wraps k8s.io/cri-streaming and knows nothing about shims, FIFOs or network
// namespaces: those belong to the Runtime it is given (package cri provides one).
package streaming
