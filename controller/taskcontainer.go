package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/config"
	"github.com/crisp-runtime/crisp/fifoio"
)

// isTaskOnly reports whether the pod runs on a task-only shim; sb.mu need not be held
// (the mode never changes).
func (sb *sandbox) isTaskOnly() bool { return sb.rec.Mode == config.SandboxModeTask }

// isTaskOnly reports whether pod sandboxID is known and runs on a task-only shim.
func (c *Controller) isTaskOnly(sandboxID string) bool {
	sb := c.get(sandboxID)
	return sb != nil && sb.isTaskOnly()
}

// createTaskOnly creates a container in a task-only shim: the handler's runtime
// options, and stdio FIFOs whose output criserver copies into the CRI log.
func (c *Controller) createTaskOnly(ctx context.Context, tc taskapi.TTRPCTaskService, sb *sandbox, cs ContainerSpec, bundle string) (_ uint32, retErr error) {
	r := ioRecord{SandboxID: cs.SandboxID, LogPath: cs.LogPath, Terminal: cs.Terminal, Stdin: cs.Stdin}
	t, err := newTaskIO(bundle, r, true, c.log.With("container", cs.ID))
	if err != nil {
		return 0, fmt.Errorf("stdio of container %s: %w", cs.ID, err)
	}
	c.iosMu.Lock()
	c.ios[cs.ID] = t
	c.iosMu.Unlock()
	defer func() {
		if retErr != nil {
			c.dropTaskIO(cs.ID)
		}
	}()
	stdin, stdout, stderr := r.fifoPaths(bundle)
	req := &taskapi.CreateTaskRequest{
		ID: cs.ID, Bundle: bundle, Terminal: cs.Terminal, Options: c.taskOpts[sb.rec.Handler],
		Stdin: stdin, Stdout: stdout, Stderr: stderr,
	}
	return c.createTask(ctx, tc, cs, req)
}

// taskIO is the output copy of container id; nil for a container of a shim that
// writes its own log.
func (c *Controller) taskIO(id string) *taskIO {
	c.iosMu.Lock()
	defer c.iosMu.Unlock()
	return c.ios[id]
}

// dropTaskIO stops the output copy of container id, if any.
func (c *Controller) dropTaskIO(id string) {
	c.iosMu.Lock()
	t := c.ios[id]
	delete(c.ios, id)
	c.iosMu.Unlock()
	if t != nil {
		t.close()
	}
}

// podContainers lists the container bundles whose io.json names pod sandboxID: the
// containers a task-only shim runs for it.
func (c *Controller) podContainers(sandboxID string) map[string]ioRecord {
	root := filepath.Join(c.opts.StateDir, "containers")
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	out := map[string]ioRecord{}
	for _, e := range entries {
		if r, ok := readIORecord(filepath.Join(root, e.Name())); ok && r.SandboxID == sandboxID {
			out[e.Name()] = r
		}
	}
	return out
}

// recoverTaskIO resumes the output copy of the containers of a task-only shim's pod
// after a restart. A container that already exited gets what its FIFOs still hold.
func (c *Controller) recoverTaskIO(ctx context.Context, sb *sandbox) {
	tc, _, err := c.task(sb.rec.ID)
	if err != nil {
		return
	}
	for id, r := range c.podContainers(sb.rec.ID) {
		bundle := c.opts.containerBundle(id)
		t, err := newTaskIO(bundle, r, false, c.log.With("container", id))
		if err != nil {
			c.log.Warn("resume output copy of container", "container", id, "err", err)
			continue
		}
		st, err := tc.State(ctx, &taskapi.StateRequest{ID: id})
		if err == nil && st.GetStatus() == tasktypes.Status_STOPPED {
			// Its writers are gone: the copy would never see them hang up.
			t.drain()
			continue
		}
		c.iosMu.Lock()
		c.ios[id] = t
		c.iosMu.Unlock()
	}
}

// cleanDeadTaskShim kills what a dead task-only shim's pod still runs: unlike crisp's
// shim, whose delete ends the whole pod, a task-only shim's delete ends the one
// container (and its mounts) it names, so it runs for every container and then for
// the pause container.
func (c *Controller) cleanDeadTaskShim(ctx context.Context, sb *sandbox) error {
	var errs []error
	for id := range c.podContainers(sb.rec.ID) {
		call := c.call(&sb.rec)
		call.id, call.bundle = id, c.opts.containerBundle(id)
		if _, err := call.delete(ctx); err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", id, err))
		}
		c.dropTaskIO(id)
	}
	if _, err := c.call(&sb.rec).delete(ctx); err != nil {
		if sb.rec.Pid != 0 {
			errs = append(errs, fmt.Errorf("pause container: %w", err))
		} else {
			// A pod whose start was cut short may have no pause container: containerd
			// 1.x's shim cannot even run delete without the files Create writes.
			c.log.Warn("delete of a pause container that may never have been created failed", "pod", sb.rec.ID, "err", err)
		}
	}
	return errors.Join(errs...)
}

// sumMetrics adds the figures of the pod's containers to its pause container's: a
// task-only shim reports no pod cgroup. Limits stay unknown (0).
func (c *Controller) sumMetrics(ctx context.Context, sandboxID string, m *Metrics) {
	m.MemoryLimit, m.AvailableBytes = 0, 0
	for id := range c.podContainers(sandboxID) {
		cm, err := c.ContainerMetrics(ctx, sandboxID, id)
		if err != nil {
			continue // created but not started, or gone meanwhile
		}
		ts := m.Timestamp
		m.Add(cm)
		m.Timestamp = ts
	}
}

// attachTaskOnly attaches to a task-only shim's container: criserver copies its
// output, so criserver serves the session.
func (c *Controller) attachTaskOnly(sandboxID, id, stdin, stdout, stderr string) error {
	t := c.taskIO(id)
	if t == nil {
		return fmt.Errorf("attach to container %s of pod %s: its output is not copied by criserver (not created through it, or deleted): %w", id, sandboxID, errdefs.ErrFailedPrecondition)
	}
	if err := t.attach(stdin, stdout, stderr); err != nil {
		switch {
		case errors.Is(err, errAttachEnded), errors.Is(err, errAttachNoStdin):
			return fmt.Errorf("attach to container %s: %w: %w", id, err, errdefs.ErrFailedPrecondition)
		case errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("attach to container %s: %w: %w", id, err, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("attach to container %s: %w", id, err)
	}
	return nil
}

// discardOutputs gives an exec without stdout or stderr (a streaming client that asked
// for neither) a FIFO whose output is dropped: containerd's runc shims insist on both
// paths, as containerd's CRI always gives them. The FIFOs live in the container's bundle
// and go once the exec's output ends; abort ends them at once, for an exec that did not
// start.
func (c *Controller) discardOutputs(es *ExecSpec) (abort func(), err error) {
	var files []*os.File
	abort = func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	for name, p := range map[string]*string{"stdout": &es.Stdout, "stderr": &es.Stderr} {
		if *p != "" || (es.Terminal && name == "stderr") {
			continue
		}
		path := filepath.Join(c.opts.containerBundle(es.ContainerID), fmt.Sprintf("exec-%s-%s", es.ExecID, name))
		if err := unix.Mkfifo(path, 0o600); err != nil {
			abort()
			return nil, fmt.Errorf("exec %s: FIFO for the unread %s: %w", es.ExecID, name, err)
		}
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			_ = os.Remove(path)
			abort()
			return nil, fmt.Errorf("exec %s: FIFO for the unread %s: %w", es.ExecID, name, err)
		}
		files = append(files, f)
		*p = path
		go func() {
			_ = fifoio.CopyFIFOIn(io.Discard, f)
			_ = f.Close()
			_ = os.Remove(path)
		}()
	}
	return abort, nil
}
