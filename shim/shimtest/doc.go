// Package shimtest owns the end-to-end tests of the shim-runc binary (built by the tests,
// run as root against real namespaces, cgroups and sockets). It must not be imported by
// production code, and its tests must remove every process, netns and cgroup they create.
package shimtest
