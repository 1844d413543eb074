package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	options "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/api/shimapi"
	"github.com/crisp-runtime/crisp/internal/atomicfile"
	"github.com/crisp-runtime/crisp/internal/mount"
)

// Type URLs containerd's typeurl gives OCI types, so any task-API shim understands ours.
const (
	processTypeURL   = "types.containerd.io/opencontainers/runtime-spec/1/Process"
	resourcesTypeURL = "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources"
)

// ContainerSpec is what the controller needs to create a container in a pod's shim.
type ContainerSpec struct {
	ID        string
	SandboxID string
	Spec      *specs.Spec
	Rootfs    []mount.Mount
	LogPath   string
	Terminal  bool
	// Stdin keeps the container's stdin open for Attach.
	Stdin bool
	// Checkpoint, when set, is a directory of CRIU images (below the state dir) the
	// container is restored from by StartContainer; it is moved into the bundle.
	Checkpoint string
}

// ContainerState is a container's process state as its shim reports it.
type ContainerState struct {
	Pid        uint32
	Status     string // created, running, stopped, unknown
	ExitStatus uint32
	ExitedAt   time.Time
	// ShimDied: the pod's shim died, and crisp killed the container (ExitStatus 137).
	ShimDied bool
}

// containerDir holds the containers' bundles, one directory per container id.
func (o Options) containerDir() string { return filepath.Join(o.StateDir, "containers") }

func (o Options) containerBundle(id string) string { return filepath.Join(o.containerDir(), id) }

// task returns the task API client of a pod's shim; FailedPrecondition when the pod's
// shim is not reachable.
func (c *Controller) task(sandboxID string) (taskapi.TTRPCTaskService, *sandbox, error) {
	sb, client, err := c.liveShim(sandboxID)
	if err != nil {
		return nil, nil, err
	}
	return taskapi.NewTTRPCTaskClient(client), sb, nil
}

// liveShim returns the pod's sandbox and its shim's connection, or an error when the
// pod is unknown or its shim is not reachable.
func (c *Controller) liveShim(sandboxID string) (*sandbox, *ttrpc.Client, error) {
	sb := c.get(sandboxID)
	if sb == nil {
		return nil, nil, fmt.Errorf("pod sandbox %s: %w", sandboxID, errdefs.ErrNotFound)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.client == nil || sb.shimDead {
		return nil, nil, fmt.Errorf("the shim of pod %s is not running: %w", sandboxID, errdefs.ErrFailedPrecondition)
	}
	return sb, sb.client, nil
}

// CreateContainer writes the container's bundle and has the pod's shim create it.
func (c *Controller) CreateContainer(ctx context.Context, cs ContainerSpec) (_ uint32, retErr error) {
	tc, sb, err := c.task(cs.SandboxID)
	if err != nil {
		return 0, err
	}
	taskOnly := sb.isTaskOnly()
	if taskOnly && cs.Checkpoint != "" {
		return 0, fmt.Errorf("restore of container %s: pod %s runs on task-only shim %s, and crisp restores checkpoints only with its own shim: %w", cs.ID, cs.SandboxID, sb.rec.Shim, errdefs.ErrNotImplemented)
	}
	bundle := c.opts.containerBundle(cs.ID)
	if err := os.MkdirAll(bundle, 0o711); err != nil {
		return 0, fmt.Errorf("create bundle of container %s: %w", cs.ID, err)
	}
	defer func() {
		if retErr != nil {
			_ = os.RemoveAll(bundle)
		}
	}()
	cs.Spec.Root = &specs.Root{Path: "rootfs", Readonly: cs.Spec.Root != nil && cs.Spec.Root.Readonly}
	data, err := json.Marshal(cs.Spec)
	if err != nil {
		return 0, fmt.Errorf("encode spec of container %s: %w", cs.ID, err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return 0, fmt.Errorf("write spec of container %s: %w", cs.ID, err)
	}
	if taskOnly {
		return c.createTaskOnly(ctx, tc, sb, cs, bundle)
	}
	opts, err := anypb.New(&options.ContainerOptions{LogPath: cs.LogPath, SandboxId: cs.SandboxID})
	if err != nil {
		return 0, err
	}
	images, err := moveCheckpoint(cs, bundle)
	if err != nil {
		return 0, err
	}
	req := &taskapi.CreateTaskRequest{ID: cs.ID, Bundle: bundle, Terminal: cs.Terminal, Options: opts, Checkpoint: images}
	if cs.Stdin {
		// A marker, not a path: the shim opens a stdin pipe it feeds from attaches.
		req.Stdin = "stdin"
	}
	return c.createTask(ctx, tc, cs, req)
}

// createTask sends the create request with the container's rootfs mounts.
func (c *Controller) createTask(ctx context.Context, tc taskapi.TTRPCTaskService, cs ContainerSpec, req *taskapi.CreateTaskRequest) (uint32, error) {
	for _, m := range cs.Rootfs {
		req.Rootfs = append(req.Rootfs, &types.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	resp, err := tc.Create(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("create container %s in the shim of pod %s: %w", cs.ID, cs.SandboxID, fromShim(err))
	}
	return resp.GetPid(), nil
}

// StartContainer starts a created container.
func (c *Controller) StartContainer(ctx context.Context, sandboxID, id string) (uint32, error) {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return 0, err
	}
	resp, err := tc.Start(ctx, &taskapi.StartRequest{ID: id})
	if err != nil {
		return 0, fmt.Errorf("start container %s: %w", id, fromShim(err))
	}
	return resp.GetPid(), nil
}

// KillContainer signals a container's init (all: every process of it).
func (c *Controller) KillContainer(ctx context.Context, sandboxID, id string, sig syscall.Signal, all bool) error {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return err
	}
	if _, err := tc.Kill(ctx, &taskapi.KillRequest{ID: id, Signal: uint32(sig), All: all}); err != nil {
		return fmt.Errorf("signal container %s with %v: %w", id, sig, fromShim(err))
	}
	return nil
}

// WaitContainer blocks until the container's init exits. When the pod's shim dies it
// returns once the pod's processes were killed, with ShimDied set.
func (c *Controller) WaitContainer(ctx context.Context, sandboxID, id string) (ContainerState, error) {
	st, err := c.wait(ctx, sandboxID, id, "")
	if err == nil || ctx.Err() != nil {
		return st, err
	}
	return c.deadShimExit(ctx, sandboxID, err)
}

func (c *Controller) wait(ctx context.Context, sandboxID, id, execID string) (ContainerState, error) {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return ContainerState{}, err
	}
	resp, err := tc.Wait(ctx, &taskapi.WaitRequest{ID: id, ExecID: execID})
	if err != nil {
		return ContainerState{}, fmt.Errorf("wait for container %s: %w", id, fromShim(err))
	}
	if execID == "" && !c.tasks.AwaitOutput(id) {
		// The exit is reported anyway: a child that inherited the output keeps the
		// FIFOs open, and its output still reaches the log.
		c.log.Debug("container output still open after its exit", "container", id)
	}
	st := ContainerState{Status: "stopped", ExitStatus: resp.GetExitStatus()}
	if t := resp.GetExitedAt(); t != nil {
		st.ExitedAt = t.AsTime()
	}
	return st, nil
}

// StateOf asks the shim for a container's state.
func (c *Controller) StateOf(ctx context.Context, sandboxID, id string) (ContainerState, error) {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return ContainerState{}, err
	}
	resp, err := tc.State(ctx, &taskapi.StateRequest{ID: id})
	if err != nil {
		return ContainerState{}, fmt.Errorf("state of container %s: %w", id, fromShim(err))
	}
	st := ContainerState{Pid: resp.GetPid(), ExitStatus: resp.GetExitStatus()}
	switch resp.GetStatus() {
	case tasktypes.Status_CREATED:
		st.Status = "created"
	case tasktypes.Status_RUNNING, tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
		st.Status = "running"
	case tasktypes.Status_STOPPED:
		st.Status = "stopped"
	default:
		st.Status = "unknown"
	}
	if t := resp.GetExitedAt(); t != nil && st.Status == "stopped" {
		st.ExitedAt = t.AsTime()
	}
	return st, nil
}

// DeleteContainer removes a container from its shim (killing it if it still runs) and
// deletes its bundle. An unknown container or a gone shim is not an error.
func (c *Controller) DeleteContainer(ctx context.Context, sandboxID, id string) error {
	tc, _, err := c.task(sandboxID)
	switch {
	case err == nil:
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err = tc.Delete(dctx, &taskapi.DeleteRequest{ID: id})
		cancel()
		if err != nil {
			if err := fromShim(err); !errdefs.IsNotFound(err) {
				return fmt.Errorf("delete container %s: %w", id, err)
			}
		}
	case errdefs.IsNotFound(err), errdefs.IsFailedPrecondition(err):
		// The shim is gone; with it every process of the container. What it mounted
		// in the host's namespace may remain.
		_ = mount.Unmount(filepath.Join(c.opts.containerBundle(id), "rootfs"))
	default:
		return err
	}
	c.tasks.DropIO(id)
	c.tasks.ForgetOOM(id)
	if err := os.RemoveAll(c.opts.containerBundle(id)); err != nil {
		return fmt.Errorf("remove bundle of container %s: %w", id, err)
	}
	return nil
}

// UpdateContainer applies new resources to a running container. res is all of the
// resources the CRI sets (cri merges an update into what the container had).
func (c *Controller) UpdateContainer(ctx context.Context, sandboxID, id string, res *specs.LinuxResources) error {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return err
	}
	data, err := json.Marshal(res)
	if err != nil {
		return fmt.Errorf("encode resources: %w", err)
	}
	if _, err := tc.Update(ctx, &taskapi.UpdateTaskRequest{ID: id, Resources: &anypb.Any{TypeUrl: resourcesTypeURL, Value: data}}); err != nil {
		return fmt.Errorf("update container %s: %w", id, fromShim(err))
	}
	// The bundle's spec is what a verbose ContainerStatus and a checkpoint's spec.dump
	// show: it follows the update, as containerd's stored container spec does. The
	// cgroup already has the new values, so a failure here is only logged.
	if err := updateSpecResources(filepath.Join(c.opts.containerBundle(id), "config.json"), res); err != nil {
		c.log.Warn("container updated, but its spec file still shows the old resources", "container", id, "err", err)
	}
	return nil
}

// updateSpecResources puts res, the CRI's part of a container's resources, into the
// spec file at path; the device rules, which no update changes, stay.
func updateSpecResources(path string, res *specs.LinuxResources) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var s specs.Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	r := s.Linux.Resources
	if r == nil {
		r = &specs.LinuxResources{}
		s.Linux.Resources = r
	}
	r.CPU, r.Memory, r.HugepageLimits, r.Unified = res.CPU, res.Memory, res.HugepageLimits, res.Unified
	if raw, err = json.Marshal(&s); err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return atomicfile.Write(path, raw, 0o600)
}

// ExecSpec is one process to run in a container.
type ExecSpec struct {
	SandboxID, ContainerID, ExecID string
	Process                        *specs.Process
	Stdin, Stdout, Stderr          string // FIFO paths, "" for none
	Terminal                       bool
}

// Exec creates and starts a process in a running container.
func (c *Controller) Exec(ctx context.Context, es ExecSpec) (retErr error) {
	tc, sb, err := c.task(es.SandboxID)
	if err != nil {
		return err
	}
	if sb.isTaskOnly() {
		abort, err := c.tasks.DiscardOutputs(es.ContainerID, es.ExecID, es.Terminal, &es.Stdout, &es.Stderr)
		if err != nil {
			return err
		}
		defer func() {
			if retErr != nil {
				abort()
			}
		}()
	}
	data, err := json.Marshal(es.Process)
	if err != nil {
		return fmt.Errorf("encode exec process: %w", err)
	}
	if _, err := tc.Exec(ctx, &taskapi.ExecProcessRequest{
		ID: es.ContainerID, ExecID: es.ExecID, Terminal: es.Terminal,
		Stdin: es.Stdin, Stdout: es.Stdout, Stderr: es.Stderr,
		Spec: &anypb.Any{TypeUrl: processTypeURL, Value: data},
	}); err != nil {
		return fmt.Errorf("exec in container %s: %w", es.ContainerID, fromShim(err))
	}
	if _, err := tc.Start(ctx, &taskapi.StartRequest{ID: es.ContainerID, ExecID: es.ExecID}); err != nil {
		c.deleteExec(es.SandboxID, es.ContainerID, es.ExecID)
		return fmt.Errorf("start exec in container %s: %w", es.ContainerID, fromShim(err))
	}
	return nil
}

// WaitExec blocks until an exec'd process exits.
func (c *Controller) WaitExec(ctx context.Context, sandboxID, id, execID string) (ContainerState, error) {
	return c.wait(ctx, sandboxID, id, execID)
}

// KillExec signals an exec'd process.
func (c *Controller) KillExec(ctx context.Context, sandboxID, id, execID string, sig syscall.Signal) error {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return err
	}
	if _, err := tc.Kill(ctx, &taskapi.KillRequest{ID: id, ExecID: execID, Signal: uint32(sig)}); err != nil {
		return fmt.Errorf("signal exec %s: %w", execID, fromShim(err))
	}
	return nil
}

// deleteExec frees an exec in the shim; best effort, with its own deadline because it
// also runs after the caller's context expired.
func (c *Controller) deleteExec(sandboxID, id, execID string) {
	tc, _, err := c.task(sandboxID)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := tc.Delete(ctx, &taskapi.DeleteRequest{ID: id, ExecID: execID}); err != nil {
		c.log.Debug("delete exec", "container", id, "exec", execID, "err", err)
	}
}

// DeleteExec frees an exec's state in the shim.
func (c *Controller) DeleteExec(sandboxID, id, execID string) { c.deleteExec(sandboxID, id, execID) }

// shimClient is a client of the crisp.shim.v1 service of a pod's shim.
func (c *Controller) shimClient(sandboxID string) (shimapi.Service, error) {
	_, client, err := c.liveShim(sandboxID)
	if err != nil {
		return nil, err
	}
	return shimapi.NewClient(client), nil
}

// ReopenContainerLog has the shim reopen a container's log file (criserver reopens
// it itself for a task-only shim's container).
func (c *Controller) ReopenContainerLog(ctx context.Context, sandboxID, id string) error {
	if t := c.tasks.IO(id); t != nil {
		if err := t.Reopen(); err != nil {
			return fmt.Errorf("reopen log of container %s: %w", id, err)
		}
		return nil
	}
	client, err := c.shimClient(sandboxID)
	if err != nil {
		return err
	}
	if _, err := client.ReopenLog(ctx, &options.ReopenLogRequest{ContainerId: id}); err != nil {
		return fmt.Errorf("reopen log of container %s: %w", id, fromShim(err))
	}
	return nil
}

// OOMKilled reports whether the container's cgroup saw an OOM kill. A task-only shim
// is asked for the cgroup's oom_kill counter (task Stats), which it can read until
// the container is deleted, unless it reported the kill with a TaskOOM event.
func (c *Controller) OOMKilled(ctx context.Context, sandboxID, id string) (bool, error) {
	if c.isTaskOnly(sandboxID) {
		m, err := c.ContainerMetrics(ctx, sandboxID, id)
		// Looked at after Stats, which gives a TaskOOM sent along with the exit time
		// to arrive (gVisor's shim sends it as its sandbox dies, so Stats fails).
		if c.tasks.OOMReported(id) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return m.OOMKills > 0, nil
	}
	client, err := c.shimClient(sandboxID)
	if err != nil {
		return false, err
	}
	resp, err := client.ContainerInfo(ctx, &options.ContainerInfoRequest{ContainerId: id})
	if err != nil {
		return false, fmt.Errorf("info of container %s: %w", id, fromShim(err))
	}
	return resp.GetOomKilled(), nil
}

// HasContainerBundle reports whether container id's bundle exists: it is written
// before the shim creates the container and removed only once the shim deleted it.
func (c *Controller) HasContainerBundle(id string) bool {
	_, err := os.Stat(c.opts.containerBundle(id))
	return err == nil
}

// RemoveOrphanContainers removes every container bundle whose id keep rejects, left by
// a CreateContainer cut short by a crash: the container is deleted from whichever
// live shim has it (its init may wait there to be started), its rootfs unmounted and
// its bundle removed. It returns the ids removed. Nothing may create containers
// meanwhile.
func (c *Controller) RemoveOrphanContainers(ctx context.Context, keep func(id string) bool) ([]string, error) {
	root := c.opts.containerDir()
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list container bundles: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if keep(id) {
			continue
		}
		if err := c.deleteFromAnyShim(ctx, id); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := mount.Unmount(filepath.Join(root, id, "rootfs")); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, id)); err != nil {
			errs = append(errs, fmt.Errorf("remove bundle of container %s: %w", id, err))
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// deleteFromAnyShim deletes container id from every live shim that has it.
func (c *Controller) deleteFromAnyShim(ctx context.Context, id string) error {
	c.mu.Lock()
	ids := make([]string, 0, len(c.sandboxes))
	for sid := range c.sandboxes {
		ids = append(ids, sid)
	}
	c.mu.Unlock()
	// A task-only shim's container names its pod: only that shim can have it, and
	// its create may still be running (see tasksandbox.Sandboxer.DeleteSettled).
	if pod, release, ok := c.tasks.OrphanPod(id); ok {
		ids = []string{pod}
		defer release()
	}
	for _, sid := range ids {
		tc, sb, err := c.task(sid)
		if err != nil {
			continue // not running: nothing of it can run in that pod
		}
		if sb.isTaskOnly() {
			err = c.tasks.DeleteSettled(ctx, tc, c.taskPod(sb), id)
		} else {
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err = tc.Delete(dctx, &taskapi.DeleteRequest{ID: id})
			cancel()
		}
		if err != nil {
			if err := fromShim(err); !errdefs.IsNotFound(err) {
				return fmt.Errorf("delete orphan container %s from the shim of pod %s: %w", id, sid, err)
			}
		}
	}
	return nil
}
