package controller

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
)

const (
	// reapTimeout bounds the cleanup after a dead shim (`shim delete`: SIGKILL and
	// wait for every process of the pod, cgroups removed).
	reapTimeout = 30 * time.Second
	// shimExitGrace is how long a shim whose connection dropped may take to be seen
	// dead: the kernel closes a killed process's sockets before it becomes a zombie.
	shimExitGrace = time.Second
	// deadShimExitStatus is what a container killed because its shim died reports:
	// 128+SIGKILL, as containerd reports a task whose shim died.
	deadShimExitStatus = 128 + uint32(syscall.SIGKILL)
)

// markShimDeadLocked records that sb's shim is gone and starts, once, the reaper that
// kills everything the pod still runs. sb.mu must be held. A sandbox still being
// created is undone by Create or Recover instead.
func (c *Controller) markShimDeadLocked(sb *sandbox, cause string) {
	sb.shimDead = true
	if sb.rec.Phase == phaseSpare {
		// No pod to reap: the spare's keeper replaces it.
		c.log.Debug("warm spare shim gone", "pod", sb.rec.ID, "cause", cause)
		c.spares.wake(sb.rec.Handler)
		return
	}
	if sb.reaping || sb.rec.Phase == phaseCreating {
		return
	}
	sb.reaping = true
	go c.reapDeadShim(sb, cause)
}

// reapDeadShim kills whatever the pod of a dead shim still runs (containers, pause)
// with the shim's own delete command, then closes sb.reaped: only then are its
// containers reported exited, so kubelet never runs a second copy of a workload next
// to the first. It is the one goroutine markShimDeadLocked starts for sb.
func (c *Controller) reapDeadShim(sb *sandbox, cause string) {
	id := sb.rec.ID
	c.opts.Metrics.ShimDied()
	start := time.Now()
	err := c.reapLocked(sb)
	sb.mu.Lock()
	sb.reapErr = err
	sb.reapedAt = time.Now()
	if err == nil {
		sb.exited = true
		if sb.rec.ExitedAt.IsZero() {
			sb.rec.ExitedAt = sb.reapedAt
		}
	}
	close(sb.reaped)
	sb.mu.Unlock()
	if err != nil {
		c.log.Error("pod shim died and its pod could not be killed", "pod", id, "cause", cause, "err", err)
		return
	}
	c.log.Warn("pod shim died; killed every process of the pod", "pod", id, "cause", cause, "duration", time.Since(start))
	select {
	case c.exits <- id:
	default:
		c.log.Warn("sandbox exit not delivered: nobody reads exits", "pod", id)
	}
}

// reapLocked runs the cleanup under the sandbox's op lock, so that it never overlaps
// a Stop or Remove of the same pod (which clean up after a dead shim themselves).
func (c *Controller) reapLocked(sb *sandbox) error {
	sb.op.Lock()
	defer sb.op.Unlock()
	if c.get(sb.rec.ID) != sb {
		return nil // removed meanwhile: Remove cleaned up everything
	}
	ctx, cancel := context.WithTimeout(c.bg, reapTimeout)
	defer cancel()
	c.killUnreachableShim(sb)
	return c.cleanDeadShim(ctx, sb)
}

// killUnreachableShim makes sure the shim of sb is gone before its pod is cleaned up
// under it: a shim whose connection dropped but whose process lives on (hung, or
// exiting) serves nobody. The pid is checked to be that shim's, never a recycled one.
func (c *Controller) killUnreachableShim(sb *sandbox) {
	sb.mu.Lock()
	pid := sb.shimPid
	sb.mu.Unlock()
	if pid <= 0 || !isShimOf(pid, sb.rec.ID) || waitGone(pid, shimExitGrace) {
		return
	}
	c.log.Warn("pod shim unreachable but running; killing it", "pod", sb.rec.ID, "pid", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	waitGone(pid, 2*time.Second)
}

// cleanDeadShim runs the shim's delete command for sb once: it kills the containers
// and the pause process and removes their cgroups and mounts. sb.op must be held.
func (c *Controller) cleanDeadShim(ctx context.Context, sb *sandbox) error {
	sb.mu.Lock()
	done := sb.cleaned
	sb.mu.Unlock()
	if done {
		return nil
	}
	if err := c.deleteWithShim(ctx, sb); err != nil {
		return fmt.Errorf("clean up after dead shim of pod %s: %w", sb.rec.ID, err)
	}
	sb.mu.Lock()
	sb.cleaned = true
	sb.mu.Unlock()
	return nil
}

// deleteWithShim runs the shim's delete command for everything of sb's pod.
func (c *Controller) deleteWithShim(ctx context.Context, sb *sandbox) error {
	if sb.isTaskOnly() {
		return c.tasks.CleanDeadShim(ctx, c.taskPod(sb))
	}
	_, err := c.call(&sb.rec).delete(ctx)
	return err
}

// deadShimExit is the exit of a container whose wait failed with werr: when the pod's
// shim is gone, the exit every container of the pod gets once the pod was killed
// (ShimDied set); otherwise werr.
func (c *Controller) deadShimExit(ctx context.Context, sandboxID string, werr error) (ContainerState, error) {
	sb := c.get(sandboxID)
	if sb == nil || !c.shimGone(sb, errors.Is(werr, ttrpc.ErrClosed)) {
		return ContainerState{}, werr
	}
	sb.mu.Lock()
	reaping := sb.reaping
	sb.mu.Unlock()
	if !reaping {
		return ContainerState{}, werr
	}
	select {
	case <-sb.reaped:
	case <-ctx.Done():
		return ContainerState{}, ctx.Err()
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.reapErr != nil {
		return ContainerState{}, fmt.Errorf("the shim of pod %s died and its processes could not be killed: %w", sandboxID, sb.reapErr)
	}
	return ContainerState{Status: "stopped", ExitStatus: deadShimExitStatus, ExitedAt: sb.reapedAt, ShimDied: true}, nil
}

// shimGone reports whether sb's shim is gone; with grace, a shim whose connection just
// closed gets shimExitGrace to be seen dead.
func (c *Controller) shimGone(sb *sandbox, grace bool) bool {
	if c.isShimGone(sb) {
		return true
	}
	if !grace {
		return false
	}
	deadline := time.Now().Add(shimExitGrace)
	for time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		if c.isShimGone(sb) {
			return true
		}
	}
	return false
}
