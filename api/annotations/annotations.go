// Package annotations names the annotations containerd's CRI plugin puts on the OCI
// spec of every pod sandbox and container (containerd's internal/cri/annotations).
// Shims read them to find a container's pod (runc v2 grouping, Kata, gVisor), tools
// that look at OCI bundles (NRI plugins, hooks, monitoring) know them, and crisp both
// writes them (its CRI server, the task-only sandboxer) and reads them (its shim,
// under containerd). A leaf package, so that every side names them once.
package annotations

// Annotation keys.
const (
	ContainerType    = "io.kubernetes.cri.container-type"
	SandboxID        = "io.kubernetes.cri.sandbox-id"
	SandboxName      = "io.kubernetes.cri.sandbox-name"
	SandboxNamespace = "io.kubernetes.cri.sandbox-namespace"
	SandboxUID       = "io.kubernetes.cri.sandbox-uid"
	ContainerName    = "io.kubernetes.cri.container-name"
	ImageName        = "io.kubernetes.cri.image-name"
	// RuncGroup is the group containerd's runc shim v2 runs a container's task in: a
	// pod's containers share their pod's shim.
	RuncGroup = "io.containerd.runc.v2.group"
)

// ContainerType's values.
const (
	ContainerTypeSandbox   = "sandbox"
	ContainerTypeContainer = "container"
)
