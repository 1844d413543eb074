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
//   - shimkit (this package): Serve, the serving shim: the ttrpc server on the socket
//     `start` handed over, with the sandboxer's sandbox service (Sandbox) and the
//     kit's task service over its task.Runner, task events, signals and shutdown.
//   - bootstrap: the binary's modes other than serving: `start` (containerd's
//     BootstrapParams or the legacy flags and environment, the socket, the serving
//     shim re-executed in its own session), `delete`'s socket removal and answer,
//     `-info`, the version, and the listener the serving shim inherits.
//   - sandbox: the sandbox API (containerd.runtime.sandbox.v1) over a Pod: states,
//     wait, status, shutdown.
//   - task: the task API (containerd.task.v3 and v2, crisp.shim.v1.Shim) over a
//     Runner: stdio, terminals, CRI logs, attach, exits, OOM kills, stats.
//   - events: task events to the caller's event service.
//   - reaper: the child subreaper.
package shimkit
