// Package shimkit is crisp's public kit for writing a sandboxer: a containerd
// runtime-v2 shim that crisp (or containerd) drives over ttrpc with the
// containerd.runtime.sandbox.v1 and containerd.task.v3/v2 APIs.
//
// It is the repository's only public tree (pkg/): everything else is crisp's own and
// may change in any commit. crisp's shim-runc is built on it, so what the kit does is
// what crisp runs.
//
// # Version policy
//
// The kit follows the version of the crisp module. Until crisp 1.0 a minor release may
// change an exported name of pkg/; every such change is listed, with what to do, in
// docs/sandboxer.md. From 1.0 on, exported names only ever gain fields, methods and
// options within a major version. The wire contract (the shim `start` protocol, the
// files a shim keeps in its bundle) follows containerd's and only ever gains fields.
//
// # Packages
//
//   - bootstrap: the binary's modes other than serving: `start` (containerd's
//     BootstrapParams or the legacy flags and environment, the socket, the serving
//     shim re-executed in its own session), `delete`'s socket removal and answer,
//     `-info`, the version, and the listener the serving shim inherits.
package shimkit
