// Package pause owns the pod's pause process: a C constructor that runs before the Go
// runtime when the shim re-executes itself with _CRISP_PAUSE=1, and the Go side that
// starts it. It must not decide policy (namespaces, sysctls) or touch cgroups.
package pause
