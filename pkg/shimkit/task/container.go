package task

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sys/unix"

	taskv3 "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	taskapi "github.com/crisp-runtime/crisp/api/containerd/types/task"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/pkg/shimkit/events"

	"github.com/crisp-runtime/crisp/internal/cgstats"
	"github.com/crisp-runtime/crisp/internal/crilog"
	"github.com/crisp-runtime/crisp/internal/tracing"
)

// Timeouts of the exit path.
const (
	// drainTimeout bounds how long an exit waits for the output to be copied: a
	// daemonized child may hold the pipe open forever.
	drainTimeout = 2 * time.Second
	// killTimeout bounds the wait for a SIGKILLed process (D state never ends).
	killTimeout = 10 * time.Second
)

// container is one container of the pod.
type container struct {
	id     string
	bundle string
	// rootfs is the directory the shim mounted the rootfs at, "" if it mounted nothing.
	rootfs     string
	privatePID bool
	init       *process
	logw       *crilog.Writer // nil without a log path
	oom        *oomWatch      // nil if the memory cgroup cannot be watched
	// runnerOOM: the Runner (an OOMReporter) said the init exited over its memory limit.
	runnerOOM atomic.Bool
	log       *slog.Logger
	svc       *Service
	// restore is set for a container created from a checkpoint until Start restores it.
	restore *restoreSpec
	// paused is set between Pause and Resume (the freezer cgroup is frozen); State
	// reports PAUSED then.
	paused atomic.Bool

	// opMu serialises the operations that change the container (start, exec start,
	// update, delete); status, wait and kill never wait for it.
	opMu sync.Mutex

	mu      sync.Mutex // guards execs, deleted, cgInfo and cg
	execs   map[string]*process
	deleted bool
	// cgInfo is what the runner that created (or restored) the container reported of
	// its cgroups; nil if it reported none.
	cgInfo *CgroupInfo
	// cg is the container's cgroup for Stats, loaded on the first call (loading probes
	// every hierarchy; a shim nobody asks for stats never pays for it).
	cg *cgstats.Cgroup
	// traceParent is the span of the call that created the container (a no-op one
	// when it was not traced): the init's exit handling is traced as its child.
	traceParent trace.Span
}

// newContainer creates the container req asks for and starts its init, which waits for
// Start. Each step undoes itself when a later one fails.
func (s *Service) newContainer(ctx context.Context, req *taskv3.CreateTaskRequest, opts *optionsv1.ContainerOptions) (_ *container, retErr error) {
	// 1. The container and its log file.
	c, err := s.openContainer(req, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			c.closeLog()
		}
	}()
	// 2. The init's stdio: the shim's ends stay, the process's go to the runner.
	p := newProcessState("", initIO(req, c.logw, labelledProcess(c.bundle)))
	var child Stdio
	sio, err := openStdio(p.io, &child, c.log)
	if err != nil {
		return nil, internal("container %q: %v", c.id, err)
	}
	creq := createRequest(req)
	creq.Stdio = child
	// 3. The runner creates the container and starts the init up to its Start. Exits
	// of orphans are recorded meanwhile: the init may exit before the runner names it.
	sub := s.reaper.Subscribe()
	defer sub.Close()
	// The runner runs to its end whatever the caller does; only the trace goes with it.
	resp, err := s.runner.Create(context.WithoutCancel(ctx), creq)
	if err != nil {
		sio.abort()
		return nil, err
	}
	c.setCreated(resp)
	ws, exited := s.reaper.Claim(sub, resp.Pid)
	sub.Close()
	// 4. From here the init runs (or ran): its waiter reaps it, and a failure kills it
	// and destroys the container.
	c.traceParent = trace.SpanFromContext(ctx)
	if err := s.watchInit(c, p, sio, resp.Pid, ws, exited); err != nil {
		c.undoCreate()
		return nil, internal("container %q: %v", c.id, err)
	}
	return c, nil
}

// newContainerFromCheckpoint prepares the container req restores from its checkpoint:
// the runner only prepares the container (for runc: mounts the rootfs and creates the
// libcontainer container), and Start restores the processes, as containerd's runc shim
// does, so that the CRI's created and started states stay apart.
func (s *Service) newContainerFromCheckpoint(ctx context.Context, req *taskv3.CreateTaskRequest, opts *optionsv1.ContainerOptions) (_ *container, retErr error) {
	id, images := req.GetID(), req.GetCheckpoint()
	if _, ok := s.runner.(Checkpointer); !ok {
		return nil, unimplemented("container %q: this shim cannot restore checkpoints", id)
	}
	if !filepath.IsAbs(images) {
		return nil, invalid("checkpoint %q of container %q must be an absolute path", images, id)
	}
	c, err := s.openContainer(req, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			c.closeLog()
		}
	}()
	resp, err := s.runner.Create(context.WithoutCancel(ctx), createRequest(req))
	if err != nil {
		return nil, err
	}
	c.setCreated(resp)
	c.restore = &restoreSpec{images: images}
	c.init = newProcessState("", initIO(req, c.logw, labelledProcess(c.bundle)))
	return c, nil
}

// openContainer returns the container of req with its CRI log open.
func (s *Service) openContainer(req *taskv3.CreateTaskRequest, opts *optionsv1.ContainerOptions) (*container, error) {
	id := req.GetID()
	c := &container{id: id, bundle: req.GetBundle(), log: s.log.With("container", id), svc: s, execs: map[string]*process{}}
	path := opts.GetLogPath()
	if path == "" {
		return c, nil
	}
	if !filepath.IsAbs(path) {
		return nil, invalid("log_path %q must be absolute", path)
	}
	w, err := crilog.Open(path, int(opts.GetLogMaxLine()))
	if err != nil {
		return nil, internal("container %q: %v", id, err)
	}
	c.logw = w
	return c, nil
}

// initIO is where a container's init's stdio goes; labelled as ioConfig's.
func initIO(req *taskv3.CreateTaskRequest, logw *crilog.Writer, labelled bool) ioConfig {
	return ioConfig{
		labelled: labelled,
		terminal: req.GetTerminal(),
		stdin:    req.GetStdin(),
		stdout:   req.GetStdout(),
		stderr:   req.GetStderr(),
		log:      logw,
		// The controller sends a marker, not a FIFO, for a container with stdin.
		stdinMarker: true,
		// Its output goes through the shim even without a log: attach joins it.
		attachable: true,
	}
}

// createRequest is the runner's request for req.
func createRequest(req *taskv3.CreateTaskRequest) *CreateRequest {
	creq := &CreateRequest{ID: req.GetID(), Bundle: req.GetBundle(), Terminal: req.GetTerminal(), Checkpoint: req.GetCheckpoint()}
	for _, m := range req.GetRootfs() {
		creq.Rootfs = append(creq.Rootfs, Mount{Type: m.GetType(), Source: m.GetSource(), Options: m.GetOptions()})
	}
	return creq
}

// setCreated records what the runner reported of the container.
func (c *container) setCreated(resp *Created) {
	c.privatePID, c.rootfs, c.cgInfo = resp.PrivatePID, resp.Rootfs, resp.Cgroup
}

// watchInit makes p, started as pid (ws and exited as the reaper's Claim said), the
// container's init: its stdio copies start, its OOM kills are watched and its waiter
// runs. An error says the init cannot be watched; it has been killed then.
func (s *Service) watchInit(c *container, p *process, sio *stdio, pid int, ws unix.WaitStatus, exited bool) error {
	c.init = p
	err := p.setStarted(pid, sio, ws, exited)
	if err != nil {
		// Without a pidfd the init cannot be waited for through the poller; killed
		// through its cgroup, its waiter reaps it blind.
		c.killAll(unix.SIGKILL)
	}
	if serr := sio.started(); err == nil {
		err = serr
	}
	// OOM kills are recorded per container; a watch that cannot be set up only costs
	// that information.
	if err == nil {
		c.oom = s.watchOOM(c)
	}
	go func() {
		c.waitInit()
		s.publishExit(c.id, c.id, p)
	}()
	return err
}

// undoCreate kills and destroys a container whose Create failed after the runner
// created it.
func (c *container) undoCreate() {
	if err := c.stop(); err != nil {
		c.log.Error("kill init after failed create", "error", err)
	}
	if err := c.destroy(); err != nil {
		c.log.Error("destroy container after failed create", "error", err)
	}
}

// closeLog closes the container's CRI log, if it has one.
func (c *container) closeLog() {
	if c.logw != nil {
		_ = c.logw.Close()
	}
}

// cgroupDir returns the container's cgroup directory of controller ("" for cgroup v2),
// or "" if it is not known.
func (c *container) cgroupDir(controller string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cgInfo == nil {
		return ""
	}
	return c.cgInfo.Paths[controller]
}

// procsDir is a cgroup directory whose cgroup.procs (with its children's) lists every
// process of the container: the unified one, else v1's devices (as libcontainer's
// GetAllPids), or another controller's.
func (c *container) procsDir() string {
	for _, ctl := range []string{"", "devices", "pids", "freezer", "memory", "cpu"} {
		if dir := c.cgroupDir(ctl); dir != "" {
			return dir
		}
	}
	return ""
}

// pids lists the processes of the container's cgroup.
func (c *container) pids() ([]int, error) {
	dir := c.procsDir()
	if dir == "" {
		return nil, errors.New("the container has no cgroup")
	}
	return cgroups.GetAllPids(dir)
}

// lockLive takes opMu for an operation that changes the container; NotFound (and
// opMu left unlocked) once the container is deleted.
func (c *container) lockLive() error {
	c.opMu.Lock()
	if c.isDeleted() {
		c.opMu.Unlock()
		return notFound("container %q not found", c.id)
	}
	return nil
}

// process returns the init ("") or an exec.
func (c *container) process(execID string) (*process, error) {
	if execID == "" {
		return c.init, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.execs[execID]
	if !ok {
		return nil, notFound("exec %q of container %q not found", execID, c.id)
	}
	return p, nil
}

// waitInit is the one waiter of the container's init.
func (c *container) waitInit() {
	p := c.init
	pid, sio := p.started()
	ws, err := p.wait(c.svc.reaper)
	at := time.Now()
	status := exitStatus(ws)
	if err != nil {
		c.log.Error("wait for container init", "pid", pid, "error", err)
		status = 255
	}
	span := c.exitSpan(at)
	defer span.End()
	// Right after the exit, before anything slow (the output drain): under the systemd
	// driver the scope, and with it memory.events, goes as soon as it is empty.
	oom := c.oom != nil && c.oom.checkExit(status == 128+uint32(unix.SIGKILL))
	if r, ok := c.svc.runner.(OOMReporter); ok && !oom && r.OOMKilled(c.id, status) {
		oom = true
		c.runnerOOM.Store(true)
		c.log.Warn("container exceeded its memory limit")
		c.svc.events.Publish(events.TaskOOM{ContainerID: c.id})
	}
	if !c.privatePID {
		// In a shared PID namespace nothing kills the rest of the container with its
		// init (containerd's shim kills them too).
		c.killAll(unix.SIGKILL)
	}
	drained := sio.drain(drainTimeout)
	// Attach sessions end with the container, even if its output stays open.
	sio.detachAll()
	if drained {
		sio.close()
		if c.logw != nil {
			_ = c.logw.Close()
		}
	} else {
		c.log.Warn("container output still open after exit; closed on delete")
	}
	p.setExited(status, at)
	span.SetAttributes(attribute.Int("crisp.exit_status", int(status)), attribute.Bool("crisp.oom_killed", oom),
		attribute.Bool("crisp.output_drained", drained))
	c.log.Info("container exited", "pid", pid, "exit_status", status, "oom_killed", oom)
	c.svc.releaseMemory()
}

// exitSpan starts the span of the init's exit handling (the OOM check, killing the
// rest of a shared-PID container, draining the output), as a child of the span that
// created the container: the exit comes long after that call, but belongs to its
// trace. A container created untraced gets a no-op span.
func (c *container) exitSpan(at time.Time) trace.Span {
	parent := c.traceParent
	if parent == nil || !parent.SpanContext().IsSampled() {
		return noop.Span{}
	}
	_, span := parent.TracerProvider().Tracer(tracing.Scope).Start(trace.ContextWithSpan(context.Background(), parent),
		"shim.container.exit", trace.WithTimestamp(at), trace.WithAttributes(tracing.AttrContainerID.String(c.id)))
	return span
}

// waitExec is the one waiter of an exec.
func (c *container) waitExec(p *process) {
	pid, sio := p.started()
	ws, err := p.wait(c.svc.reaper)
	at := time.Now()
	status := exitStatus(ws)
	if err != nil {
		c.log.Error("wait for exec", "exec", p.execID, "pid", pid, "error", err)
		status = 255
	}
	if !sio.drain(drainTimeout) {
		c.log.Warn("exec output still open after exit", "exec", p.execID)
	}
	// Nothing more can come: release the fds and goroutines now, not only on delete.
	sio.close()
	p.setExited(status, at)
	c.log.Debug("exec exited", "exec", p.execID, "pid", pid, "exit_status", status)
	c.svc.releaseMemory()
}

// killAll signals every process in the container's cgroup; SIGKILL goes through
// cgroup.kill where there is one (cgroup v2), which no fork can escape.
func (c *container) killAll(sig syscall.Signal) {
	if sig == unix.SIGKILL {
		if dir := c.cgroupDir(""); dir != "" {
			err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
			if err == nil {
				return
			}
			if !errors.Is(err, os.ErrNotExist) {
				c.log.Debug("kill container through cgroup.kill", "error", err)
			}
		}
	}
	pids, err := c.pids()
	if err != nil {
		c.log.Debug("list container processes", "error", err)
		return
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			c.log.Warn("signal container process", "pid", pid, "error", err)
		}
	}
}

// stop kills the container's processes and waits until the init's exit is recorded.
func (c *container) stop() error {
	c.abandonRestore()
	if !c.init.exited() {
		if err := c.init.signal(unix.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) && !errors.Is(err, errNotStarted) {
			c.log.Warn("kill container", "error", err)
		}
		if !c.privatePID {
			// A private PID namespace dies with its init; a shared one does not.
			c.killAll(unix.SIGKILL)
		}
	}
	t := time.NewTimer(killTimeout)
	defer t.Stop()
	select {
	case <-c.init.done:
	case <-t.C:
		return fmt.Errorf("container %s did not exit %s after SIGKILL", c.id, killTimeout)
	}
	// Execs die with the container; wait for their waiters so nothing is left.
	c.mu.Lock()
	execs := make([]*process, 0, len(c.execs))
	for _, p := range c.execs {
		execs = append(execs, p)
	}
	c.mu.Unlock()
	for _, p := range execs {
		if err := c.stopExec(p); err != nil {
			return err
		}
	}
	return nil
}

// stopExec kills a running exec and waits for its waiter.
func (c *container) stopExec(p *process) error {
	st, _, _ := p.state()
	if st == taskapi.Status_CREATED {
		return nil
	}
	if !p.exited() {
		if err := p.signal(unix.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
			c.log.Warn("kill exec", "exec", p.execID, "error", err)
		}
	}
	t := time.NewTimer(killTimeout)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("exec %s did not exit %s after SIGKILL", p.execID, killTimeout)
	}
}

// destroy removes what the container holds once its processes are gone: stdio, log, OOM
// watch, and, through the runner, its state, cgroup leaf and the rootfs mount.
func (c *container) destroy() error {
	if _, sio := c.init.started(); sio != nil {
		sio.close()
	}
	if c.logw != nil {
		_ = c.logw.Close()
	}
	if c.oom != nil {
		c.oom.stop()
	}
	return c.svc.runner.Delete(context.Background(), c.id, c.rootfs)
}
