package task

import (
	"context"
	"os"
)

// Runner is what a sandboxer does with its containers; the Service does the rest: the
// task API and its checks, stdio FIFOs, terminals, CRI logs, attach, exits (the pids a
// Runner returns are the shim's children, waited for through pidfds and the reaper),
// OOM kills and stats from the container's cgroup, and task events.
//
// Its methods return errors of github.com/containerd/errdefs kinds (Errorf), which the
// shim's server turns into gRPC codes (GRPCStatus); any other error is Internal.
// The Service serialises the calls for one container; calls for different containers
// run concurrently.
type Runner interface {
	// Create makes container req.ID from its bundle and starts its init process up to
	// the point where it waits for Start, with req.Stdio as its stdio. The init must
	// be the shim's child by the time Create returns (a child subreaper's adoption
	// counts). On error the Runner has removed what it made.
	Create(ctx context.Context, req *CreateRequest) (*Created, error)
	// Start lets the init of a created container run. exited closes if the init
	// exits meanwhile (a Start waiting for it must then return).
	Start(ctx context.Context, id string, exited <-chan struct{}) error
	// Exec starts a process (req.Process, an OCI Process as JSON) in a running
	// container and returns its pid, the shim's child.
	Exec(ctx context.Context, req *ExecRequest) (pid int, err error)
	// Update applies resources (an OCI LinuxResources as JSON) to a running container.
	Update(ctx context.Context, id string, resources []byte) error
	// Delete removes what Create made (state, cgroup, the rootfs mount at rootfs when
	// not "") once the container's processes are gone; done twice, it succeeds.
	Delete(ctx context.Context, id, rootfs string) error
}

// Pauser is a Runner that can freeze and thaw a container (task Pause and Resume;
// without it they answer Unimplemented).
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// OOMReporter is a Runner that enforces a memory limit itself (a WebAssembly
// runtime's pages, a VM's memory), so that the container's cgroup never sees the OOM
// kill its init ended with. The kit reports such an exit as an OOM kill: a TaskOOM
// event and ContainerInfo's oom_killed, which crisp turns into the CRI's OOMKilled.
type OOMReporter interface {
	// OOMKilled reports whether container id's init, which exited with status,
	// ended for exceeding its memory limit. It is asked once, at the exit.
	OOMKilled(id string, status uint32) bool
}

// Checkpointer is a Runner that can dump a running container and restore one (task
// Checkpoint, and Create with a checkpoint; without it they answer Unimplemented).
type Checkpointer interface {
	// Checkpoint dumps a running container into req.Images. It is the one Runner
	// call whose ctx ends it: the Runner then stops and leaves the container running.
	Checkpoint(ctx context.Context, req *CheckpointRequest) error
	// Restore starts the processes of a container created with CreateRequest.Checkpoint
	// from its images, with req.Stdio as the init's stdio.
	Restore(ctx context.Context, req *RestoreRequest) (*Created, error)
}

// Stdio are a process's stdio and, with a terminal, the socket its console's master
// is to be sent to (the Service receives it); nil is none. They are the process's
// ends: the Runner passes them on and may close its copies once the process has them.
type Stdio struct {
	Stdin, Stdout, Stderr, ConsoleSocket *os.File
}

// Mount is one mount of a container's root filesystem.
type Mount struct {
	Type    string
	Source  string
	Options []string
}

// CreateRequest is a container to create.
type CreateRequest struct {
	ID     string
	Bundle string
	// Rootfs are the mounts of the root filesystem; none means the bundle's spec
	// names a ready one.
	Rootfs   []Mount
	Terminal bool
	// Checkpoint, when set, says the container is restored from these images by
	// Restore: Create only prepares it and starts no process.
	Checkpoint string
	Stdio      Stdio
}

// Created is what the Runner made of a container (or restored).
type Created struct {
	// Pid is the init's pid, 0 for a container prepared for a restore.
	Pid int
	// PrivatePID says the container has a PID namespace of its own: its processes
	// die with its init. Otherwise the Service kills the rest of the cgroup.
	PrivatePID bool
	// Rootfs is the directory Create mounted the root filesystem at, "" for none;
	// Delete gets it back.
	Rootfs string
	// Cgroup is where the container's processes are, for killing, listing, OOM
	// watching and stats; nil for none.
	Cgroup *CgroupInfo
}

// CgroupInfo is what the Service needs of a container's cgroups: the directories per
// controller ("" for cgroup v2) for OOM watching, killing and listing, and the path
// below the hierarchy roots statistics are read from.
type CgroupInfo struct {
	Paths map[string]string `json:"paths,omitempty"`
	Stats string            `json:"stats,omitempty"`
	// StatsErr says why Stats is empty.
	StatsErr string `json:"stats_err,omitempty"`
}

// ExecRequest is a process to start in a running container.
type ExecRequest struct {
	ID       string
	ExecID   string
	Terminal bool
	// Process is the OCI Process as the caller sent it (JSON).
	Process []byte
	Stdio   Stdio
}

// CheckpointRequest is a container to dump, with what CRIU is asked.
type CheckpointRequest struct {
	ID           string
	Images       string
	Work         string
	LeaveRunning bool
	TCP          bool
	ExtUnix      bool
	ShellJob     bool
	FileLocks    bool
	// EmptyNS are the clone flags of the namespaces restored empty.
	EmptyNS     uint32
	CgroupsMode string
}

// RestoreRequest is a container created from a checkpoint to restore.
type RestoreRequest struct {
	ID         string
	Bundle     string
	Terminal   bool
	Checkpoint string
	Stdio      Stdio
}
