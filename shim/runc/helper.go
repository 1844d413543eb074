package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/crisp-runtime/crisp/internal/spawn"
	"github.com/crisp-runtime/crisp/internal/tracing"
	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

// HelperArg is the hidden first argument that makes the shim binary a short-lived task
// helper: `shim-runc _task ACTION ID`, with a helperRequest as JSON on stdin and a
// helperResponse as JSON on stdout (see RunHelper).
//
// The long-lived shim never calls into libcontainer: creating, starting, exec'ing,
// updating, checkpointing, pausing and destroying a container all run in a helper, as
// containerd's runc shim runs `runc create`, `runc exec --detach` and so on. What
// libcontainer leaves behind (encoding/json's per-type caches, its config and cgroup
// manager state, a heap grown by the spec conversion) then dies with the helper instead
// of staying mapped in every pod's shim for the pod's whole life.
const HelperArg = "_task"

// Helper actions.
const (
	helperCreate     = "create"
	helperExec       = "exec"
	helperRestore    = "restore"
	helperUpdate     = "update"
	helperCheckpoint = "checkpoint"
	helperPause      = "pause"
	helperResume     = "resume"
	helperDelete     = "delete"
)

// helperStdio holds the helper's descriptors of a process's stdio and console socket,
// inherited from the shim (exec.Cmd.ExtraFiles); 0 means none.
type helperStdio struct {
	Stdin         int `json:"stdin,omitempty"`
	Stdout        int `json:"stdout,omitempty"`
	Stderr        int `json:"stderr,omitempty"`
	ConsoleSocket int `json:"console_socket,omitempty"`
}

// helperMount is one mount of a container's root filesystem.
type helperMount struct {
	Type    string   `json:"type"`
	Source  string   `json:"source"`
	Options []string `json:"options,omitempty"`
}

// helperCriu is what a checkpoint asks of CRIU.
type helperCriu struct {
	Images       string `json:"images"`
	Work         string `json:"work,omitempty"`
	LeaveRunning bool   `json:"leave_running,omitempty"`
	TCP          bool   `json:"tcp,omitempty"`
	ExtUnix      bool   `json:"ext_unix,omitempty"`
	ShellJob     bool   `json:"shell_job,omitempty"`
	FileLocks    bool   `json:"file_locks,omitempty"`
	EmptyNS      uint32 `json:"empty_ns,omitempty"`
	CgroupsMode  string `json:"cgroups_mode,omitempty"`
}

// helperRequest is what the shim tells a helper; which fields count depends on the action.
type helperRequest struct {
	Root     string `json:"root"`
	ID       string `json:"id"`
	ExecID   string `json:"exec_id,omitempty"`
	Bundle   string `json:"bundle,omitempty"`
	Terminal bool   `json:"terminal,omitempty"`
	// Rootfs are the mounts create mounts the container's root filesystem from.
	Rootfs []helperMount `json:"rootfs,omitempty"`
	// Checkpoint, for create, says the container is restored from these CRIU images by
	// Start; for restore, it names them.
	Checkpoint string      `json:"checkpoint,omitempty"`
	Stdio      helperStdio `json:"stdio"`
	// Process is an exec's OCI process, Resources an update's OCI LinuxResources, both
	// as the caller sent them: the shim never decodes them into the OCI types.
	Process   json.RawMessage `json:"process,omitempty"`
	Resources json.RawMessage `json:"resources,omitempty"`
	Criu      *helperCriu     `json:"criu,omitempty"`
	// RootfsDir, for delete, is the mount the shim's create made: unmounted and removed.
	RootfsDir string `json:"rootfs_dir,omitempty"`
	// RootfsFromState, for delete, unmounts the rootfs the container's libcontainer
	// state names (a create whose helper died before it answered).
	RootfsFromState bool `json:"rootfs_from_state,omitempty"`
}

// helperResponse is the helper's answer; Code is a gRPC code, 0 on success.
type helperResponse struct {
	Code  uint32 `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// Pid is the process create, exec or restore started.
	Pid int `json:"pid,omitempty"`
	// PrivatePID says the container has a PID namespace of its own (create).
	PrivatePID bool `json:"private_pid,omitempty"`
	// Rootfs is the directory create mounted the root filesystem at, "" if none.
	Rootfs string           `json:"rootfs,omitempty"`
	Cgroup *task.CgroupInfo `json:"cgroup,omitempty"`
}

// helperWaitDelay bounds how long the shim waits for a helper's stdout to close after
// it exited (only a descendant that inherited it could keep it open), and, for a
// cancelled checkpoint, for the helper to stop CRIU after SIGTERM before it is killed.
const helperWaitDelay = 30 * time.Second

// runHelper runs a helper for action with req and files as its fds 3 and up. A helper
// that answered returns its response, and its error, of the kind its answer names, when it failed (it
// has undone what it did then). A helper that did not answer (it crashed or was killed)
// returns a nil response: what it did is unknown, and the caller has to clean up. A
// cancellable ctx sends the helper SIGTERM when it ends (checkpoint stops CRIU then);
// other actions run to their end so that nothing is left half done.
func (r *Runner) runHelper(ctx context.Context, action string, req *helperRequest, files []*os.File) (_ *helperResponse, err error) {
	ctx, span := tracing.Start(ctx, "shim.helper", attribute.String("crisp.helper.action", action), tracing.AttrContainerID.String(req.ID))
	defer tracing.Finish(span, &err)
	req.Root = r.root
	in, err := json.Marshal(req)
	if err != nil {
		return nil, internal("%s helper of container %q: encode request: %v", action, req.ID, err)
	}
	cmd := exec.CommandContext(ctx, r.helper, HelperArg, action, req.ID)
	cmd.Cancel = func() error { return cmd.Process.Signal(unix.SIGTERM) }
	cmd.WaitDelay = helperWaitDelay
	cmd.Stdin = bytes.NewReader(in)
	var out bytes.Buffer
	cmd.Stdout = &out
	// The helper's log and libcontainer's go to the shim's log.
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = files
	// A helper must not outlive the shim: `shim-runc delete` cleans up after a dead
	// shim, and a helper still creating a container then would leave it running.
	// Started from the spawn thread, it gets that signal only when the shim dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	// The reaper's Start holds its gate only around the fork, so it may run there.
	if err := spawn.Do(func() error { return r.reaper.Start(cmd) }); err != nil {
		return nil, internal("%s helper of container %q: %v", action, req.ID, err)
	}
	werr := r.reaper.Wait(cmd)
	var resp helperResponse
	if err := json.Unmarshal(out.Bytes(), &resp); err != nil {
		if werr == nil {
			werr = err
		}
		return nil, internal("%s helper of container %q gave no answer: %v", action, req.ID, werr)
	}
	r.log.Debug("task helper", "action", action, "container", req.ID, "duration", time.Since(start), "code", resp.Code)
	if resp.Code != uint32(codes.OK) {
		return &resp, task.Errorf(task.KindOf(codes.Code(resp.Code)), "%s", resp.Error)
	}
	return &resp, nil
}

// helperFiles lists the files of c for exec.Cmd.ExtraFiles and says which fd each gets
// in the helper.
func helperFiles(c task.Stdio) ([]*os.File, helperStdio) {
	var (
		files []*os.File
		fds   helperStdio
	)
	add := func(f *os.File) int {
		if f == nil {
			return 0
		}
		files = append(files, f)
		return 2 + len(files)
	}
	fds.Stdin = add(c.Stdin)
	fds.Stdout = add(c.Stdout)
	fds.Stderr = add(c.Stderr)
	fds.ConsoleSocket = add(c.ConsoleSocket)
	return files, fds
}

// cleanupAfterHelper removes what a helper that gave no answer may have left of
// container id: its processes, libcontainer state and cgroup, and its rootfs mount (the
// one the bundle's spec names) if mountedRootfs says the create was asked to mount one.
func (r *Runner) cleanupAfterHelper(id, bundle string, mountedRootfs bool) {
	req := &helperRequest{ID: id, RootfsFromState: mountedRootfs}
	if mountedRootfs {
		req.Bundle = bundle
	}
	_, err := r.runHelper(context.Background(), helperDelete, req, nil)
	if err != nil {
		r.log.Error("clean up after a failed task helper", "container", id, "error", err)
	}
}
