// Package streaming owns criserver's streaming HTTP server: the SPDY and websocket
// endpoints behind the URLs that the CRI Exec, Attach and PortForward calls return.
//
// SPDY exec/attach and port-forward come from k8s.io/cri-streaming; the token cache
// and the websocket exec/attach protocols are its own (see Server). It knows nothing
// about shims, FIFOs or network namespaces: those belong to the Runtime it is given
// (package cri provides one).
package streaming
