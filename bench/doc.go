// Package bench measures crisp against Debian's containerd on the same machine: it
// starts each runtime with its own root, state, socket, bridge and subnet, drives both
// through the same CRI client code, and reports each figure with the crisp/containerd
// ratio. `make bench` runs it (bench_test.go, build tag "bench"); nothing here runs in
// `make test` except the unit tests of the pure parts.
package bench
