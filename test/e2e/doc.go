// Package e2e holds crisp's end-to-end tests: they build the real binaries, start a
// real criserver with its own root, state, socket and CNI network, and drive it over
// the CRI gRPC API with real pods. They need root and skip with a reason otherwise.
package e2e
