package task

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"

	taskv3 "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	taskapi "github.com/crisp-runtime/crisp/api/containerd/types/task"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/api/shimapi"
	"github.com/crisp-runtime/crisp/internal/crilog"
	"github.com/crisp-runtime/crisp/internal/podfiles"
	"github.com/crisp-runtime/crisp/internal/version"
	"github.com/crisp-runtime/crisp/pkg/shimkit/events"
	"github.com/crisp-runtime/crisp/pkg/shimkit/reaper"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/selinux/go-selinux"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Reaper is the part of the shim's reaper (package reaper) the task service and a
// runner need. A runner may run helpers as the shim's children (Start, Wait), as
// crisp's runc runner does; the processes they start are re-parented to the shim when
// the helper exits (or earlier), and the service claims their pids then, from a
// subscription opened before the runner ran that caught those that exited meanwhile.
type Reaper interface {
	// Start starts cmd and tracks it for the caller, who must Wait.
	Start(cmd *exec.Cmd) error
	// Wait waits for a command started with Start.
	Wait(cmd *exec.Cmd) error
	// Subscribe records the exits of untracked children until the subscription closes.
	Subscribe() *reaper.Subscription
	// Claim tracks pid for the caller, or returns its status if it was reaped already.
	Claim(sub *reaper.Subscription, pid int) (unix.WaitStatus, bool)
	// Forget stops tracking pid after its owner has waited for it.
	Forget(pid int)
}

// Config wires a Service to its shim.
type Config struct {
	// SandboxID is the pod this shim serves; containers naming another are refused.
	SandboxID string
	// Runner creates, starts, execs, updates and removes the containers.
	Runner Runner
	Logger *slog.Logger
	Reaper Reaper
	// Events receives containerd's task events; nil publishes none.
	Events *events.Publisher
	// SandboxPid is the pause process of the sandbox this shim serves (false before
	// StartSandbox, or with no sandbox); nil is none. Connect answers for the sandbox's
	// id with it: containerd 2.x reconnects to a sandbox shim after its own restart by
	// a task Connect on the sandbox id, and takes NotFound for a dead shim.
	SandboxPid func() (int, bool)
	// PodFiles are the pod's /etc files and /dev/shm when the shim made them for
	// containerd's shim sandboxer (false otherwise); nil is none. Create mounts them
	// into the pod's containers whose spec lacks them (addPodMounts).
	PodFiles func() (podfiles.Paths, bool)
	// OnIdleShutdown is called by a task Shutdown that finds no container left. The
	// shim exits then unless it serves a sandbox (CreateSandbox): under containerd's
	// podsandbox, and with task-only callers, the shim's life is its tasks', as with
	// containerd-shim-runc-v2.
	OnIdleShutdown func()
}

// Service implements containerd.task.v3.Task (and, registered by Register, task v2 and
// crisp.shim.v1.Shim) for the containers of one pod.
type Service struct {
	sandboxID string
	// sandboxPid is Config.SandboxPid.
	sandboxPid func() (int, bool)
	podFiles   func() (podfiles.Paths, bool)
	runner     Runner
	log        *slog.Logger
	reaper     Reaper
	events     *events.Publisher
	onIdle     func()

	mu         sync.Mutex
	containers map[string]*container
	// reserved holds ids whose Create is in progress.
	reserved map[string]struct{}
	// release returns freed memory to the kernel a moment after a burst of work.
	release *time.Timer
	// closed is set by DeleteAll: the pod is going away and takes no new containers.
	closed bool
}

var (
	_ taskv3.TTRPCTaskService = (*Service)(nil)
	_ shimapi.Service         = (*Service)(nil)
)

// New returns the service.
func New(cfg Config) (*Service, error) {
	if cfg.Runner == nil {
		return nil, errors.New("task service: a runner is required")
	}
	if cfg.Reaper == nil {
		return nil, errors.New("task service: a reaper is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Service{
		runner:     cfg.Runner,
		sandboxID:  cfg.SandboxID,
		sandboxPid: cfg.SandboxPid,
		podFiles:   cfg.PodFiles,
		log:        log,
		reaper:     cfg.Reaper,
		events:     cfg.Events,
		onIdle:     cfg.OnIdleShutdown,
		containers: map[string]*container{},
		reserved:   map[string]struct{}{},
	}, nil
}

// Register serves s as containerd.task.v3.Task, containerd.task.v2.Task and
// crisp.shim.v1.Shim on srv.
func Register(srv *ttrpc.Server, s *Service) {
	taskv3.RegisterTTRPCTaskService(srv, s)
	registerV2(srv, s)
	shimapi.Register(srv, s)
}

// releaseDelay is how long the shim waits after its last container event before it
// returns freed memory to the kernel.
const releaseDelay = time.Second

// releaseMemory schedules a garbage collection that returns free pages to the kernel,
// postponed while events keep coming. Each container start, exec and delete leaves a
// few hundred KiB of garbage that the runtime would otherwise keep mapped until heap
// growth triggers a collection: measured, an idle shim drops from ~7 to ~4 MiB of
// anonymous memory after a run of containers. Memory is what a per-pod process costs.
func (s *Service) releaseMemory() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.release == nil {
		s.release = time.AfterFunc(releaseDelay, debug.FreeOSMemory)
		return
	}
	s.release.Reset(releaseDelay)
}

func (s *Service) get(id string) (*container, error) {
	s.mu.Lock()
	c := s.containers[id]
	s.mu.Unlock()
	if c == nil {
		return nil, notFound("container %q not found", id)
	}
	return c, nil
}

// getLocked returns container id with its opMu held for an operation that changes
// it; NotFound for an unknown or deleted container.
func (s *Service) getLocked(id string) (*container, error) {
	c, err := s.get(id)
	if err != nil {
		return nil, err
	}
	if err := c.lockLive(); err != nil {
		return nil, err
	}
	return c, nil
}

func (s *Service) lookup(id, execID string) (*container, *process, error) {
	c, err := s.get(id)
	if err != nil {
		return nil, nil, err
	}
	p, err := c.process(execID)
	if err != nil {
		return nil, nil, err
	}
	return c, p, nil
}

// Create creates a container from the bundle's config.json through the runner: rootfs
// mounted, container created, init started up to the point where it waits for Start.
// A container from a checkpoint is only prepared: Start restores it.
func (s *Service) Create(ctx context.Context, req *taskv3.CreateTaskRequest) (*taskv3.CreateTaskResponse, error) {
	id := req.GetID()
	if !ValidID(id) {
		return nil, invalid("container id %q: want 1-128 characters of [A-Za-z0-9_.+-]", id)
	}
	unreserve, err := s.reserve(id)
	if err != nil {
		return nil, err
	}
	defer unreserve()
	opts, err := s.createOptions(req)
	if err != nil {
		return nil, err
	}
	create := s.newContainer
	if req.GetCheckpoint() != "" {
		create = s.newContainerFromCheckpoint
	}
	c, err := create(ctx, req, opts)
	if err != nil {
		return nil, err
	}
	if err := s.add(c); err != nil {
		c.undoCreate()
		return nil, err
	}
	if c.restore != nil {
		c.log.Info("container created from a checkpoint", "images", c.restore.images, "bundle", c.bundle)
		return &taskv3.CreateTaskResponse{}, nil
	}
	s.releaseMemory()
	pid, _ := c.init.started()
	c.log.Info("container created", "pid", pid, "bundle", c.bundle, "log", opts.GetLogPath(), "terminal", req.GetTerminal())
	s.events.Publish(createEvent(req, pid))
	return &taskv3.CreateTaskResponse{Pid: uint32(pid)}, nil
}

// reserve claims id for a Create in progress, so concurrent creates of it fail and
// others proceed; the returned func releases it.
func (s *Service) reserve(id string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, failedPrecondition("the pod is shutting down")
	}
	_, exists := s.containers[id]
	_, creating := s.reserved[id]
	if exists || creating {
		return nil, alreadyExists("container %q already exists", id)
	}
	s.reserved[id] = struct{}{}
	return func() {
		s.mu.Lock()
		delete(s.reserved, id)
		s.mu.Unlock()
	}, nil
}

// createOptions decodes Create's options and checks the request against this shim; it
// mounts the pod's files into the bundle's spec where the spec lacks them.
func (s *Service) createOptions(req *taskv3.CreateTaskRequest) (*optionsv1.ContainerOptions, error) {
	id := req.GetID()
	opts, err := unpackOptions(req.GetOptions())
	if err != nil {
		return nil, err
	}
	if sb := opts.GetSandboxId(); sb != "" && s.sandboxID != "" && sb != s.sandboxID {
		return nil, invalid("container %q belongs to sandbox %q; this shim serves %q", id, sb, s.sandboxID)
	}
	bundle := req.GetBundle()
	if !filepath.IsAbs(bundle) || filepath.Clean(bundle) != bundle {
		return nil, invalid("bundle %q must be an absolute, clean path", bundle)
	}
	if s.podFiles == nil {
		return opts, nil
	}
	files, ok := s.podFiles()
	if !ok {
		return opts, nil
	}
	added, err := addPodMounts(bundle, s.sandboxID, files)
	if err != nil {
		return nil, invalid("container %q: %v", id, err)
	}
	if added {
		s.log.Debug("pod files mounted into the container's spec", "container", id)
	}
	return opts, nil
}

// add registers a created container; it fails once DeleteAll has run, which cannot
// have seen c.
func (s *Service) add(c *container) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return failedPrecondition("the pod is shutting down")
	}
	s.containers[c.id] = c
	return nil
}

// createEvent is the /tasks/create event of a created container.
func createEvent(req *taskv3.CreateTaskRequest, pid int) events.TaskCreate {
	ev := events.TaskCreate{ContainerID: req.GetID(), Bundle: req.GetBundle(), Stdin: req.GetStdin(), Stdout: req.GetStdout(),
		Stderr: req.GetStderr(), Terminal: req.GetTerminal(), Checkpoint: req.GetCheckpoint(), Pid: uint32(pid)}
	for _, m := range req.GetRootfs() {
		ev.Rootfs = append(ev.Rootfs, events.Mount{Type: m.GetType(), Source: m.GetSource(), Target: m.GetTarget(), Options: m.GetOptions()})
	}
	return ev
}

// publishExit sends /tasks/exit for p once its waiter has recorded the exit; id is
// the exec id, or the container id for the init (as containerd's shims say it).
func (s *Service) publishExit(containerID, id string, p *process) {
	pid, _ := p.started()
	_, code, at := p.state()
	s.events.Publish(events.TaskExit{ContainerID: containerID, ID: id, Pid: uint32(pid), ExitStatus: code, ExitedAt: at})
}

// watchOOM watches the container's memory cgroup; nil if it cannot.
func (s *Service) watchOOM(c *container) *oomWatch {
	dir := c.cgroupDir("memory")
	if dir == "" {
		dir = c.cgroupDir("") // cgroup v2
	}
	if dir == "" {
		c.log.Warn("watch OOM kills: no memory cgroup")
		return nil
	}
	id := c.id
	w, err := watchOOM(dir, c.log, func() {
		c.log.Warn("OOM killer killed a process of the container")
		s.events.Publish(events.TaskOOM{ContainerID: id})
	})
	if err != nil {
		c.log.Warn("watch OOM kills", "error", err)
		return nil
	}
	return w
}

func unpackOptions(a *anypb.Any) (*optionsv1.ContainerOptions, error) {
	opts := &optionsv1.ContainerOptions{}
	if a == nil || a.GetTypeUrl() == "" || isRuncOptions(a.GetTypeUrl()) {
		return opts, nil
	}
	if !a.MessageIs(opts) {
		return nil, invalid("options must be %s, got %q", opts.ProtoReflect().Descriptor().FullName(), a.GetTypeUrl())
	}
	if err := a.UnmarshalTo(opts); err != nil {
		return nil, invalid("decode options: %v", err)
	}
	return opts, nil
}

// runcOptionsName is containerd's runc shim options message. containerd 2.x sends it
// with every container it creates in a shim sandbox, carrying only the task API
// address and version of that same shim (client WithTaskAPIEndpoint): nothing this shim
// needs, so it stands for "no options".
const runcOptionsName = "containerd.runc.v1.Options"

// isRuncOptions reports whether typeURL names containerd's runc options, with or
// without a URL prefix.
func isRuncOptions(typeURL string) bool {
	return typeURL == runcOptionsName || strings.HasSuffix(typeURL, "/"+runcOptionsName)
}

// ValidID reports whether id can name a container or an exec: what runc accepts as a
// container id, bounded in length.
func ValidID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := range len(id) {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '+' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Start starts a created container's program, or an exec.
func (s *Service) Start(ctx context.Context, req *taskv3.StartRequest) (*taskv3.StartResponse, error) {
	c, err := s.getLocked(req.GetID())
	if err != nil {
		return nil, err
	}
	defer c.opMu.Unlock()
	if req.GetExecID() != "" {
		return s.startExec(ctx, c, req.GetExecID())
	}
	if c.restore != nil {
		return s.startRestore(ctx, c)
	}
	p := c.init
	switch st, _, _ := p.state(); st {
	case taskapi.Status_RUNNING:
		return nil, failedPrecondition("container %q is already running", c.id)
	case taskapi.Status_STOPPED:
		return nil, failedPrecondition("container %q has exited", c.id)
	}
	if err := s.runner.Start(ctx, c.id, p.done); err != nil {
		return nil, err
	}
	p.setRunning()
	pid, _ := p.started()
	c.log.Info("container started", "pid", pid)
	s.events.Publish(events.TaskStart{ContainerID: c.id, Pid: uint32(pid)})
	return &taskv3.StartResponse{Pid: uint32(pid)}, nil
}

func (c *container) isDeleted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deleted
}

// startExec runs an exec inside the container; opMu is held.
func (s *Service) startExec(ctx context.Context, c *container, execID string) (_ *taskv3.StartResponse, retErr error) {
	p, err := c.process(execID)
	if err != nil {
		return nil, err
	}
	if st, _, _ := p.state(); st != taskapi.Status_CREATED {
		return nil, failedPrecondition("exec %q of container %q was already started", execID, c.id)
	}
	if st, _, _ := c.init.state(); st == taskapi.Status_STOPPED {
		return nil, failedPrecondition("container %q is not running", c.id)
	}
	var child Stdio
	sio, err := openStdio(p.io, &child, c.log.With("exec", execID))
	if err != nil {
		return nil, internal("exec %q: %v", execID, err)
	}
	sub := s.reaper.Subscribe()
	defer sub.Close()
	pid, err := s.runner.Exec(context.WithoutCancel(ctx), &ExecRequest{
		ID: c.id, ExecID: execID, Terminal: p.io.terminal, Process: p.spec, Stdio: child,
	})
	if err != nil {
		sio.abort()
		return nil, err
	}
	ws, exited := s.reaper.Claim(sub, pid)
	sub.Close()
	startErr := p.setStarted(pid, sio, ws, exited)
	if startErr != nil {
		c.log.Error("exec started but cannot be watched", "exec", execID, "pid", pid, "error", startErr)
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	p.spec = nil
	p.setRunning()
	// The copiers must run before the waiter drains them.
	if err := sio.started(); startErr == nil && err != nil {
		startErr = err
		_ = p.signal(unix.SIGKILL)
	}
	go func() {
		c.waitExec(p)
		s.publishExit(c.id, execID, p)
	}()
	if startErr != nil {
		return nil, internal("exec %q: %v", execID, startErr)
	}
	s.events.Publish(events.TaskExecStarted{ContainerID: c.id, ExecID: execID, Pid: uint32(pid)})
	return &taskv3.StartResponse{Pid: uint32(pid)}, nil
}

// Delete removes a container (killing it if it still runs: nothing is left behind) or
// frees an exec. The caller removes the bundle directory itself.
func (s *Service) Delete(ctx context.Context, req *taskv3.DeleteRequest) (*taskv3.DeleteResponse, error) {
	// A Create of the id still in progress (its caller may have died and be deleting
	// what it left after a restart) is waited for, so it cannot finish after the delete.
	if err := s.awaitCreate(ctx, req.GetID()); err != nil {
		return nil, err
	}
	c, err := s.getLocked(req.GetID())
	if err != nil {
		return nil, err
	}
	defer c.opMu.Unlock()
	if execID := req.GetExecID(); execID != "" {
		return c.deleteExec(execID)
	}
	if err := s.deleteContainer(c); err != nil {
		return nil, err
	}
	pid, _ := c.init.started()
	_, code, at := c.init.state()
	s.events.Publish(events.TaskDelete{ContainerID: c.id, Pid: uint32(pid), ExitStatus: code, ExitedAt: at})
	return &taskv3.DeleteResponse{Pid: uint32(pid), ExitStatus: code, ExitedAt: timestamppb.New(at)}, nil
}

// awaitCreate waits until no Create of id is in progress.
func (s *Service) awaitCreate(ctx context.Context, id string) error {
	for {
		s.mu.Lock()
		_, creating := s.reserved[id]
		s.mu.Unlock()
		if !creating {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// deleteContainer stops and destroys c; opMu is held.
func (s *Service) deleteContainer(c *container) error {
	if err := c.stop(); err != nil {
		return internal("delete container %q: %v", c.id, err)
	}
	if err := c.destroy(); err != nil {
		// Kept: a retry repeats the steps, each of which tolerates being done.
		return internal("delete container %q: %v", c.id, err)
	}
	c.mu.Lock()
	c.deleted = true
	c.mu.Unlock()
	s.mu.Lock()
	delete(s.containers, c.id)
	s.mu.Unlock()
	c.log.Info("container deleted")
	s.releaseMemory()
	return nil
}

// deleteExec kills the exec if it still runs and forgets it; opMu is held.
func (c *container) deleteExec(execID string) (*taskv3.DeleteResponse, error) {
	p, err := c.process(execID)
	if err != nil {
		return nil, err
	}
	if err := c.stopExec(p); err != nil {
		return nil, internal("delete exec %q: %v", execID, err)
	}
	pid, sio := p.started()
	if sio != nil {
		sio.close()
	}
	c.mu.Lock()
	delete(c.execs, execID)
	c.mu.Unlock()
	_, code, at := p.state()
	resp := &taskv3.DeleteResponse{Pid: uint32(pid), ExitStatus: code}
	if !at.IsZero() {
		resp.ExitedAt = timestamppb.New(at)
	}
	return resp, nil
}

// DeleteAll deletes every container: the pod is going away (ShutdownSandbox, SIGTERM).
func (s *Service) DeleteAll(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	all := make([]*container, 0, len(s.containers))
	for _, c := range s.containers {
		all = append(all, c)
	}
	s.mu.Unlock()
	var errs []error
	for _, c := range all {
		c.opMu.Lock()
		if !c.isDeleted() {
			if err := s.deleteContainer(c); err != nil {
				errs = append(errs, err)
			}
		}
		c.opMu.Unlock()
	}
	return errors.Join(errs...)
}

// Exec registers a process to run in the container; Start runs it.
func (s *Service) Exec(ctx context.Context, req *taskv3.ExecProcessRequest) (*emptypb.Empty, error) {
	c, err := s.get(req.GetID())
	if err != nil {
		return nil, err
	}
	execID := req.GetExecID()
	if !ValidID(execID) {
		return nil, invalid("exec id %q: want 1-128 characters of [A-Za-z0-9_.+-]", execID)
	}
	a := req.GetSpec()
	if a == nil || a.GetTypeUrl() != processTypeURL {
		return nil, invalid("exec spec must be a %s, got %q", processTypeURL, a.GetTypeUrl())
	}
	// Only what validateProcess looks at is decoded: the runner decodes the whole
	// process, and decoding it here would keep encoding/json's caches for every OCI
	// type it holds alive in the shim.
	var spec struct {
		Args         []string `json:"args"`
		Cwd          string   `json:"cwd"`
		SelinuxLabel string   `json:"selinuxLabel"`
	}
	if err := json.Unmarshal(a.GetValue(), &spec); err != nil {
		return nil, invalid("decode exec spec: %v", err)
	}
	if err := validateProcess(&specs.Process{Args: spec.Args, Cwd: spec.Cwd}); err != nil {
		return nil, invalid("exec %q: %v", execID, err)
	}
	if st, _, _ := c.init.state(); st == taskapi.Status_STOPPED {
		return nil, failedPrecondition("container %q is not running", c.id)
	}
	p := newProcessState(execID, ioConfig{
		labelled: spec.SelinuxLabel != "" && selinux.GetEnabled(),
		terminal: req.GetTerminal(),
		stdin:    req.GetStdin(),
		stdout:   req.GetStdout(),
		stderr:   req.GetStderr(),
	})
	p.spec = a.GetValue()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deleted {
		return nil, notFound("container %q not found", c.id)
	}
	if _, ok := c.execs[execID]; ok {
		return nil, alreadyExists("exec %q of container %q already exists", execID, c.id)
	}
	c.execs[execID] = p
	s.events.Publish(events.TaskExecAdded{ContainerID: c.id, ExecID: execID})
	return &emptypb.Empty{}, nil
}

// Kill signals the init or an exec; all signals every process of the container.
func (s *Service) Kill(ctx context.Context, req *taskv3.KillRequest) (*emptypb.Empty, error) {
	c, p, err := s.lookup(req.GetID(), req.GetExecID())
	if err != nil {
		return nil, err
	}
	sig := syscall.Signal(req.GetSignal())
	if p == c.init {
		if req.GetAll() {
			// Also after the init exited: a shared PID namespace may leave processes.
			c.killAll(sig)
			return &emptypb.Empty{}, nil
		}
		if p.exited() {
			return nil, notFound("container %q: process already finished", c.id)
		}
		if err := p.signal(sig); err != nil {
			if errors.Is(err, os.ErrProcessDone) || errors.Is(err, errNotStarted) {
				return nil, notFound("container %q: process already finished", c.id)
			}
			return nil, internal("signal container %q: %v", c.id, err)
		}
		if sig == unix.SIGKILL && !c.privatePID {
			// As libcontainer's Signal: with a shared PID namespace the rest of the
			// container does not die with its init.
			c.killAll(sig)
		}
		return &emptypb.Empty{}, nil
	}
	if st, _, _ := p.state(); st == taskapi.Status_CREATED {
		return nil, failedPrecondition("exec %q of container %q is not started", p.execID, c.id)
	}
	if err := p.signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return nil, notFound("exec %q: process already finished", p.execID)
		}
		return nil, internal("signal exec %q: %v", p.execID, err)
	}
	return &emptypb.Empty{}, nil
}

// Wait blocks until the process has exited (and its output is copied) or ctx ends.
func (s *Service) Wait(ctx context.Context, req *taskv3.WaitRequest) (*taskv3.WaitResponse, error) {
	_, p, err := s.lookup(req.GetID(), req.GetExecID())
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	_, code, at := p.state()
	return &taskv3.WaitResponse{ExitStatus: code, ExitedAt: timestamppb.New(at)}, nil
}

// State reports a process's status, pid and exit.
func (s *Service) State(ctx context.Context, req *taskv3.StateRequest) (*taskv3.StateResponse, error) {
	c, p, err := s.lookup(req.GetID(), req.GetExecID())
	if err != nil {
		return nil, err
	}
	st, code, at := p.state()
	if st == taskapi.Status_RUNNING && c.paused.Load() {
		st = taskapi.Status_PAUSED
	}
	pid, _ := p.started()
	resp := &taskv3.StateResponse{
		ID:         c.id,
		ExecID:     p.execID,
		Bundle:     c.bundle,
		Pid:        uint32(pid),
		Status:     st,
		Stdin:      p.io.stdin,
		Stdout:     p.io.stdout,
		Stderr:     p.io.stderr,
		Terminal:   p.io.terminal,
		ExitStatus: code,
	}
	if st == taskapi.Status_STOPPED {
		resp.ExitedAt = timestamppb.New(at)
	}
	return resp, nil
}

// Pids lists the processes in the container's cgroup.
func (s *Service) Pids(ctx context.Context, req *taskv3.PidsRequest) (*taskv3.PidsResponse, error) {
	c, err := s.get(req.GetID())
	if err != nil {
		return nil, err
	}
	pids, err := c.pids()
	if err != nil {
		return nil, internal("list processes of container %q: %v", c.id, err)
	}
	resp := &taskv3.PidsResponse{}
	for _, pid := range pids {
		resp.Processes = append(resp.Processes, &taskapi.ProcessInfo{Pid: uint32(pid)})
	}
	return resp, nil
}

// ResizePty sets the terminal size of the init or an exec.
func (s *Service) ResizePty(ctx context.Context, req *taskv3.ResizePtyRequest) (*emptypb.Empty, error) {
	c, p, err := s.lookup(req.GetID(), req.GetExecID())
	if err != nil {
		return nil, err
	}
	_, sio := p.started()
	if sio == nil {
		return nil, failedPrecondition("process %q of container %q is not started", p.execID, c.id)
	}
	if err := sio.resize(req.GetWidth(), req.GetHeight()); err != nil {
		if errors.Is(err, errNoTerminal) {
			return nil, failedPrecondition("process %q of container %q has no terminal", p.execID, c.id)
		}
		return nil, internal("resize terminal: %v", err)
	}
	return &emptypb.Empty{}, nil
}

// CloseIO closes the stdin of the init or an exec: the process reads EOF.
func (s *Service) CloseIO(ctx context.Context, req *taskv3.CloseIORequest) (*emptypb.Empty, error) {
	_, p, err := s.lookup(req.GetID(), req.GetExecID())
	if err != nil {
		return nil, err
	}
	if _, sio := p.started(); req.GetStdin() && sio != nil {
		sio.closeStdin()
	}
	return &emptypb.Empty{}, nil
}

// Update applies new cgroup resources (an OCI LinuxResources as JSON) to a container.
func (s *Service) Update(ctx context.Context, req *taskv3.UpdateTaskRequest) (*emptypb.Empty, error) {
	c, err := s.get(req.GetID())
	if err != nil {
		return nil, err
	}
	a := req.GetResources()
	if a == nil || a.GetTypeUrl() != resourcesTypeURL {
		return nil, invalid("resources must be a %s, got %q", resourcesTypeURL, a.GetTypeUrl())
	}
	// Decoded by the runner, into OCI types the shim does not keep caches for.
	if !json.Valid(a.GetValue()) {
		return nil, invalid("decode resources: not valid JSON")
	}
	if err := c.lockLive(); err != nil {
		return nil, err
	}
	defer c.opMu.Unlock()
	if c.init.exited() {
		return nil, failedPrecondition("container %q is not running", c.id)
	}
	if err := s.runner.Update(context.WithoutCancel(ctx), c.id, a.GetValue()); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// Connect reports the shim's and the container's pids.
func (s *Service) Connect(ctx context.Context, req *taskv3.ConnectRequest) (*taskv3.ConnectResponse, error) {
	c, err := s.get(req.GetID())
	if err != nil {
		if req.GetID() == s.sandboxID && s.sandboxPid != nil {
			if pid, ok := s.sandboxPid(); ok {
				return &taskv3.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: uint32(pid), Version: version.Version}, nil
			}
		}
		return nil, err
	}
	pid, _ := c.init.started()
	return &taskv3.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: uint32(pid), Version: version.Version}, nil
}

// Shutdown does nothing: the shim's life belongs to the pod, and ShutdownSandbox ends it.
// containerd calls Shutdown after deleting a task; exiting then would kill the pod.
func (s *Service) Shutdown(ctx context.Context, req *taskv3.ShutdownRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	idle := len(s.containers) == 0 && len(s.reserved) == 0
	s.mu.Unlock()
	if idle && s.onIdle != nil {
		// After the reply: exiting first would cut it off.
		context.AfterFunc(ctx, s.onIdle)
		return &emptypb.Empty{}, nil
	}
	s.log.Debug("task Shutdown ignored: the sandbox owns the shim's lifetime")
	return &emptypb.Empty{}, nil
}

// ReopenLog reopens a container's log file (crisp.shim.v1.Shim).
func (s *Service) ReopenLog(ctx context.Context, req *optionsv1.ReopenLogRequest) (*optionsv1.ReopenLogResponse, error) {
	c, err := s.get(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if c.logw == nil {
		return nil, failedPrecondition("container %q has no log path", c.id)
	}
	if err := c.logw.Reopen(); err != nil {
		if errors.Is(err, crilog.ErrClosed) {
			return nil, failedPrecondition("container %q is not running", c.id)
		}
		return nil, internal("reopen log of container %q: %v", c.id, err)
	}
	return &optionsv1.ReopenLogResponse{}, nil
}

// ContainerInfo reports whether the container saw an OOM kill (crisp.shim.v1.Shim).
func (s *Service) ContainerInfo(ctx context.Context, req *optionsv1.ContainerInfoRequest) (*optionsv1.ContainerInfoResponse, error) {
	c, err := s.get(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	return &optionsv1.ContainerInfoResponse{OomKilled: c.runnerOOM.Load() || (c.oom != nil && c.oom.check())}, nil
}

// Attach connects the caller's FIFOs to a running container's init (crisp.shim.v1.Shim):
// its output is copied to stdout and stderr besides the log, stdin into its stdin.
func (s *Service) Attach(ctx context.Context, req *optionsv1.AttachRequest) (*optionsv1.AttachResponse, error) {
	c, err := s.get(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if c.isDeleted() {
		return nil, notFound("container %q not found", c.id)
	}
	if st, _, _ := c.init.state(); st != taskapi.Status_RUNNING {
		return nil, failedPrecondition("container %q is not running", c.id)
	}
	_, sio := c.init.started()
	if sio == nil {
		return nil, failedPrecondition("container %q is not running", c.id)
	}
	if err := sio.attach(req.GetStdin(), req.GetStdout(), req.GetStderr()); err != nil {
		switch {
		case errors.Is(err, errAttachClosed):
			return nil, failedPrecondition("container %q is not running", c.id)
		case errors.Is(err, errAttachNoStdin), errors.Is(err, errAttachNoOutput):
			return nil, failedPrecondition("attach to container %q: %v", c.id, err)
		case errors.Is(err, os.ErrNotExist):
			return nil, invalid("attach to container %q: %v", c.id, err)
		}
		return nil, internal("attach to container %q: %v", c.id, err)
	}
	c.log.Debug("attached", "stdin", req.GetStdin() != "", "stdout", req.GetStdout() != "", "stderr", req.GetStderr() != "")
	return &optionsv1.AttachResponse{}, nil
}
