package runc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

// descriptorsFile is what libcontainer writes next to the CRIU images at checkpoint
// time: the paths of the init's stdio, which restore maps onto the new process's pipes.
const descriptorsFile = "descriptors.json"

// Config wires a Runner to its shim.
type Config struct {
	// StateRoot is libcontainer's state directory, owned by this shim.
	StateRoot string
	Logger    *slog.Logger
	// Reaper runs the helpers as the shim's children.
	Reaper task.Reaper
	// Helper is the binary run as the task helper (HelperArg); "" is the running
	// binary itself, which the shim is.
	Helper string
}

// Runner runs a pod's containers with libcontainer, each operation in a task helper:
// task.Runner, task.Pauser and task.Checkpointer.
type Runner struct {
	root   string
	helper string
	reaper task.Reaper
	log    *slog.Logger
}

var (
	_ task.Runner       = (*Runner)(nil)
	_ task.Pauser       = (*Runner)(nil)
	_ task.Checkpointer = (*Runner)(nil)
)

// New returns the runner; it creates the state root.
func New(cfg Config) (*Runner, error) {
	if cfg.StateRoot == "" || !filepath.IsAbs(cfg.StateRoot) {
		return nil, fmt.Errorf("runc runner: state root %q must be an absolute path", cfg.StateRoot)
	}
	if cfg.Reaper == nil {
		return nil, errors.New("runc runner: a reaper is required")
	}
	if err := os.MkdirAll(cfg.StateRoot, 0o700); err != nil {
		return nil, fmt.Errorf("runc runner: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	helper := cfg.Helper
	if helper == "" {
		// Not os.Executable's path: /proc/self/exe stays this binary even once an
		// upgrade has replaced the file.
		helper = "/proc/self/exe"
	}
	return &Runner{root: cfg.StateRoot, helper: helper, reaper: cfg.Reaper, log: log}, nil
}

// Create mounts the rootfs, creates the libcontainer container and starts its init up
// to libcontainer's exec fifo, in a helper. A helper that gave no answer is followed by
// a delete helper that removes whatever it made.
func (r *Runner) Create(ctx context.Context, req *task.CreateRequest) (*task.Created, error) {
	if req.Checkpoint != "" {
		if _, err := os.Stat(filepath.Join(req.Checkpoint, descriptorsFile)); err != nil {
			return nil, invalid("checkpoint %q of container %q holds no CRIU images of a container (%s): %v", req.Checkpoint, req.ID, descriptorsFile, err)
		}
	}
	files, fds := helperFiles(req.Stdio)
	hreq := &helperRequest{ID: req.ID, Bundle: req.Bundle, Terminal: req.Terminal, Checkpoint: req.Checkpoint, Stdio: fds}
	for _, m := range req.Rootfs {
		hreq.Rootfs = append(hreq.Rootfs, helperMount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	resp, err := r.runHelper(ctx, helperCreate, hreq, files)
	if err != nil {
		if resp == nil {
			r.cleanupAfterHelper(req.ID, req.Bundle, len(hreq.Rootfs) > 0)
		}
		return nil, err
	}
	return &task.Created{Pid: resp.Pid, PrivatePID: resp.PrivatePID, Rootfs: resp.Rootfs, Cgroup: resp.Cgroup}, nil
}

// Start opens the exec fifo, as libcontainer's Exec does: the init runs the program
// once it sees the reader. Nothing of libcontainer is needed for it, so no helper runs.
func (r *Runner) Start(_ context.Context, id string, exited <-chan struct{}) error {
	if err := startInit(filepath.Join(r.root, id, execFifoName), exited); err != nil {
		return failedPrecondition("start container %q: %v", id, err)
	}
	return nil
}

// Exec starts a process in a running container, in a helper (as `runc exec --detach`).
func (r *Runner) Exec(ctx context.Context, req *task.ExecRequest) (int, error) {
	files, fds := helperFiles(req.Stdio)
	resp, err := r.runHelper(ctx, helperExec, &helperRequest{
		ID: req.ID, ExecID: req.ExecID, Terminal: req.Terminal, Process: req.Process, Stdio: fds,
	}, files)
	if err != nil {
		return 0, err
	}
	return resp.Pid, nil
}

// Update applies new cgroup resources, in a helper (as `runc update`).
func (r *Runner) Update(ctx context.Context, id string, resources []byte) error {
	_, err := r.runHelper(ctx, helperUpdate, &helperRequest{ID: id, Resources: resources}, nil)
	return err
}

// Delete removes the libcontainer state, the cgroup leaf and the rootfs mount, in a
// helper.
func (r *Runner) Delete(ctx context.Context, id, rootfs string) error {
	_, err := r.runHelper(ctx, helperDelete, &helperRequest{ID: id, RootfsDir: rootfs}, nil)
	return err
}

// Pause freezes the container's freezer cgroup, in a helper.
func (r *Runner) Pause(ctx context.Context, id string) error {
	_, err := r.runHelper(ctx, helperPause, &helperRequest{ID: id}, nil)
	return err
}

// Resume thaws the container's freezer cgroup, in a helper.
func (r *Runner) Resume(ctx context.Context, id string) error {
	_, err := r.runHelper(ctx, helperResume, &helperRequest{ID: id}, nil)
	return err
}

// Checkpoint dumps the container with CRIU in a helper; when ctx ends the helper gets
// SIGTERM, kills CRIU and thaws the container.
func (r *Runner) Checkpoint(ctx context.Context, req *task.CheckpointRequest) error {
	_, err := r.runHelper(ctx, helperCheckpoint, &helperRequest{ID: req.ID, Criu: &helperCriu{
		Images:       req.Images,
		Work:         req.Work,
		LeaveRunning: req.LeaveRunning,
		TCP:          req.TCP,
		ExtUnix:      req.ExtUnix,
		ShellJob:     req.ShellJob,
		FileLocks:    req.FileLocks,
		EmptyNS:      req.EmptyNS,
		CgroupsMode:  req.CgroupsMode,
	}}, nil)
	return err
}

// Restore restores a created container's processes from its checkpoint with CRIU, in
// a helper (libcontainer's Restore).
func (r *Runner) Restore(ctx context.Context, req *task.RestoreRequest) (*task.Created, error) {
	files, fds := helperFiles(req.Stdio)
	resp, err := r.runHelper(ctx, helperRestore, &helperRequest{
		ID: req.ID, Bundle: req.Bundle, Terminal: req.Terminal, Checkpoint: req.Checkpoint, Stdio: fds,
	}, files)
	if err != nil {
		return nil, err
	}
	return &task.Created{Pid: resp.Pid, Cgroup: resp.Cgroup}, nil
}
