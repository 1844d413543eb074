// Package pause owns a pod's pause process: a C constructor that runs before the Go
// runtime when the shim binary re-executes itself with _CRISP_PAUSE=1 (a binary that
// links this package gets it; it needs cgo), and the Go side that starts it. It must
// not decide policy (namespaces, sysctls) or touch cgroups.
package pause
