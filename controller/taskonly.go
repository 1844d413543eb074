package controller

import (
	"context"
	"maps"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"

	options "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/tasksandbox"
)

// What the controller hands the task-only sandboxer (package tasksandbox): the pod as
// recorded, the shim binary's delete, the pause container's bundle from the pod's Spec.

// isTaskOnly reports whether the pod runs on a task-only shim; sb.mu need not be held
// (the mode never changes).
func (sb *sandbox) isTaskOnly() bool { return sb.rec.Mode == config.SandboxModeTask }

// isTaskOnly reports whether pod sandboxID is known and runs on a task-only shim.
func (c *Controller) isTaskOnly(sandboxID string) bool {
	sb := c.get(sandboxID)
	return sb != nil && sb.isTaskOnly()
}

// taskPod is sb's pod as the task-only sandboxer knows it. sb.mu need not be held:
// only the fields a pod's shim is started with are read.
func (c *Controller) taskPod(sb *sandbox) tasksandbox.Pod {
	return tasksandbox.Pod{
		ID: sb.rec.ID, Handler: sb.rec.Handler, Namespace: sb.rec.Namespace, Shim: sb.rec.Shim,
		Bundle: sb.rec.Bundle, Started: sb.rec.Pid != 0, Binary: shimBinary{c.call(&sb.rec)},
	}
}

// shimBinary runs `shim delete` for any task of a task-only shim's pod.
type shimBinary struct{ call shimCall }

// Delete runs `shim delete` for task id with its bundle.
func (b shimBinary) Delete(ctx context.Context, id, bundle string) error {
	b.call.id, b.call.bundle = id, bundle
	_, err := b.call.delete(ctx)
	return err
}

// pauseBundle is the pause container of spec's pod on a task-only shim.
func (c *Controller) pauseBundle(sb *sandbox, spec Spec) tasksandbox.PauseBundle {
	opts := spec.Sandbox
	if opts == nil {
		opts = &options.SandboxOptions{}
	}
	pb := tasksandbox.PauseBundle{
		ID: spec.ID, Name: spec.Name, Namespace: spec.Namespace, UID: spec.UID, NetNS: sb.rec.NetNS,
		Binary: c.opts.PauseBinary, CgroupsPath: spec.PauseCgroupsPath, Annotations: maps.Clone(spec.Annotations), Options: opts,
	}
	if pb.Annotations == nil {
		pb.Annotations = map[string]string{}
	}
	maps.Copy(pb.Annotations, spec.PauseAnnotations)
	if spec.HostNetwork {
		pb.NetNS = ""
	}
	return pb
}

// prepareTaskShim readies the bundle of a task-only shim's pod before its start (an
// adopted spare's shim log is read already).
func (c *Controller) prepareTaskShim(sb *sandbox, spec Spec, adopted bool) error {
	l, err := c.tasks.PrepareStart(c.taskPod(sb), c.pauseBundle(sb, spec), adopted)
	if err != nil {
		return err
	}
	if l != nil {
		sb.setShimLog(l)
	}
	return nil
}

// resumeShimLog reads a task-only shim's log FIFO again after a restart.
func (c *Controller) resumeShimLog(sb *sandbox) {
	if !sb.isTaskOnly() {
		return
	}
	if l := c.tasks.ResumeShimLog(c.taskPod(sb)); l != nil {
		sb.setShimLog(l)
	}
}

func (sb *sandbox) setShimLog(l *tasksandbox.ShimLog) {
	sb.mu.Lock()
	sb.shimLog = l
	sb.mu.Unlock()
}

// closeShimLog stops the copy of a task-only shim's log.
func (sb *sandbox) closeShimLog() {
	sb.mu.Lock()
	l := sb.shimLog
	sb.shimLog = nil
	sb.mu.Unlock()
	l.Close()
}

// createTaskOnly creates a container in a task-only shim: the handler's runtime
// options, and stdio FIFOs whose output criserver copies into the CRI log.
func (c *Controller) createTaskOnly(ctx context.Context, tc taskapi.TTRPCTaskService, sb *sandbox, cs ContainerSpec, bundle string) (_ uint32, retErr error) {
	r := tasksandbox.IORecord{SandboxID: cs.SandboxID, LogPath: cs.LogPath, Terminal: cs.Terminal, Stdin: cs.Stdin}
	stdin, stdout, stderr, err := c.tasks.OpenIO(cs.ID, r)
	if err != nil {
		return 0, err
	}
	defer func() {
		if retErr != nil {
			c.tasks.DropIO(cs.ID)
		}
	}()
	req := &taskapi.CreateTaskRequest{
		ID: cs.ID, Bundle: bundle, Terminal: cs.Terminal, Options: c.tasks.Options(sb.rec.Handler),
		Stdin: stdin, Stdout: stdout, Stderr: stderr,
	}
	return c.createTask(ctx, tc, cs, req)
}

// settlePause lets a pod whose start was cut short settle in its task-only shim
// before it is torn down (see tasksandbox.Sandboxer.SettlePause).
func (c *Controller) settlePause(ctx context.Context, sb *sandbox) {
	tc, _, err := c.task(sb.rec.ID)
	if err != nil {
		return
	}
	c.tasks.SettlePause(ctx, tc, c.taskPod(sb))
}

// recoverTaskIO resumes the output copy of the containers of a task-only shim's pod
// after a restart.
func (c *Controller) recoverTaskIO(ctx context.Context, sb *sandbox) {
	tc, _, err := c.task(sb.rec.ID)
	if err != nil {
		return
	}
	c.tasks.RecoverIO(ctx, tc, sb.rec.ID)
}

// sumMetrics adds the figures of the pod's containers to its pause container's: a
// task-only shim reports no pod cgroup. Limits stay unknown (0).
func (c *Controller) sumMetrics(ctx context.Context, sandboxID string, m *Metrics) {
	m.MemoryLimit, m.AvailableBytes = 0, 0
	for id := range c.tasks.PodContainers(sandboxID) {
		cm, err := c.ContainerMetrics(ctx, sandboxID, id)
		if err != nil {
			continue // created but not started, or gone meanwhile
		}
		ts := m.Timestamp
		m.Add(cm)
		m.Timestamp = ts
	}
}
