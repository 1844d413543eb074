// Package sandbox is the kit's containerd.runtime.sandbox.v1 service for one pod over a
// Pod the sandboxer provides: the calls' checks and states, WaitSandbox, status, ping,
// platform and ShutdownSandbox's hand-over to the shim's exit are the kit's. It must
// not import a runtime (the Pod holds the pause process, the VM or nothing).
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	"github.com/crisp-runtime/crisp/api/containerd/types"
)

// Sandbox states reported by SandboxStatus, as containerd's CRI spells them.
const (
	StateReady    = "SANDBOX_READY"
	StateNotReady = "SANDBOX_NOTREADY"
)

// Pod is what a sandboxer does for its pod; the Service calls it with its lifecycle
// calls serialised and returns its errdefs kinds (Errorf) as gRPC codes.
type Pod interface {
	// Create prepares the pod req describes: its options checked, its cgroup, its
	// files. On error nothing of it is left.
	Create(ctx context.Context, req *CreateRequest) error
	// Start starts the pod's own process (a pause process, a VM's monitor), once; a
	// pod without one returns nil. On error nothing of it runs.
	Start(ctx context.Context) (Process, error)
	// Stop releases what the running pod held (its cgroup), once its process has
	// exited or, without one, at StopSandbox.
	Stop(ctx context.Context) error
	// Remove releases what outlives a stop (the pod's files): ShutdownSandbox and a
	// signal ending the shim call it after Stop.
	Remove(ctx context.Context) error
	// Exited is told how the sandbox ended, once (to record it for `delete`).
	Exited(status uint32, at time.Time)
	// Metrics are SandboxMetrics' data (a cgroups v1 or v2 Metrics).
	Metrics(ctx context.Context) (*anypb.Any, error)
	// Info is SandboxStatus's info; verbose is set when the caller asked for more.
	Info(verbose bool) map[string]string
}

// Process is a pod's own process.
type Process interface {
	Pid() int
	StartedAt() time.Time
	// Stop ends it: SIGTERM, then SIGKILL after grace (at once for 0).
	Stop(ctx context.Context, grace time.Duration) error
	// Done is closed once it has exited; Exited then says how.
	Done() <-chan struct{}
	Exited() (status uint32, at time.Time, ok bool)
}

// CreateRequest is the pod CreateSandbox asks for.
type CreateRequest struct {
	ID         string
	BundlePath string
	NetNSPath  string
	// Options are the caller's: crisp's SandboxOptions, or containerd's CRI
	// runtime.v1.PodSandboxConfig under its shim sandboxer.
	Options     *anypb.Any
	Annotations map[string]string
	Rootfs      []*types.Mount
}

// Config wires a Service to its shim.
type Config struct {
	// ID is the shim's -id: the one sandbox this shim serves.
	ID string
	// Name is the runtime's name, for messages.
	Name   string
	Pod    Pod
	Logger *slog.Logger
	// BeforeShutdownReply runs when ShutdownSandbox has cleaned up, before it replies
	// (shimkit.Env.RemoveSocket).
	BeforeShutdownReply func()
	// AfterShutdownReply runs once the reply to ShutdownSandbox has been handed to the
	// transport (shimkit.Env.Exit); it must not block.
	AfterShutdownReply func()
}

// Service implements containerd.runtime.sandbox.v1.Sandbox for one pod, and
// shimkit.Sandbox.
type Service struct {
	id          string
	name        string
	pod         Pod
	log         *slog.Logger
	beforeReply func()
	afterReply  func()

	// opMu serialises lifecycle operations and is held across their slow steps;
	// mu guards the state and is never held across anything slow, so status and wait
	// calls are not blocked by a stop in progress.
	opMu sync.Mutex
	mu   sync.Mutex
	// created is set by CreateSandbox; proc by StartSandbox (nil for a pod without a
	// process); stopped by a stop.
	created   bool
	proc      Process
	started   bool
	stopped   bool
	createdAt time.Time

	finishOnce sync.Once
	done       chan struct{} // closed once the sandbox has exited (or stopped unstarted)
	exitStatus uint32
	exitedAt   time.Time
}

var _ sandboxapi.TTRPCSandboxService = (*Service)(nil)

// New returns the service; nothing happens until CreateSandbox.
func New(cfg Config) *Service {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Service{
		id:          cfg.ID,
		name:        cfg.Name,
		pod:         cfg.Pod,
		log:         log.With("sandbox", cfg.ID),
		beforeReply: cfg.BeforeShutdownReply,
		afterReply:  cfg.AfterShutdownReply,
		done:        make(chan struct{}),
	}
	if s.beforeReply == nil {
		s.beforeReply = func() {}
	}
	if s.afterReply == nil {
		s.afterReply = func() {}
	}
	return s
}

// Errorf is an error of an errdefs kind whose text is the formatted message alone: what
// a Pod returns so that the caller gets the kind's gRPC code and the message unchanged.
func Errorf(kind interface{ WithMessage(string) error }, format string, args ...any) error {
	return kind.WithMessage(fmt.Sprintf(format, args...))
}

func (s *Service) notThis(id string) error {
	return Errorf(errdefs.ErrNotFound, "sandbox %q not found: this shim serves %q", id, s.id)
}

// lookup checks that id is this shim's created sandbox.
func (s *Service) lookup(id string) error {
	if id != s.id {
		return s.notThis(id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.created {
		return Errorf(errdefs.ErrNotFound, "sandbox %q not created yet", id)
	}
	return nil
}

// CreateSandbox has the Pod prepare the pod.
func (s *Service) CreateSandbox(ctx context.Context, req *sandboxapi.CreateSandboxRequest) (*sandboxapi.CreateSandboxResponse, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if req.GetSandboxID() != s.id {
		return nil, Errorf(errdefs.ErrInvalidArgument, "sandbox id %q: this shim was started for %q", req.GetSandboxID(), s.id)
	}
	if s.Created() {
		return nil, Errorf(errdefs.ErrAlreadyExists, "sandbox %q already created", s.id)
	}
	if err := s.pod.Create(ctx, &CreateRequest{
		ID: req.GetSandboxID(), BundlePath: req.GetBundlePath(), NetNSPath: req.GetNetnsPath(),
		Options: req.GetOptions(), Annotations: req.GetAnnotations(), Rootfs: req.GetRootfs(),
	}); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.created, s.createdAt = true, time.Now().UTC()
	s.mu.Unlock()
	return &sandboxapi.CreateSandboxResponse{}, nil
}

// StartSandbox has the Pod start its process and watches it; a second start of a
// running sandbox answers as the first.
func (s *Service) StartSandbox(ctx context.Context, req *sandboxapi.StartSandboxRequest) (*sandboxapi.StartSandboxResponse, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if err := s.lookup(req.GetSandboxID()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	p, started, stopped := s.proc, s.started, s.stopped
	s.mu.Unlock()
	if started && !stopped && !isDone(s.done) {
		return s.startResponse(p), nil
	}
	if stopped || started {
		return nil, Errorf(errdefs.ErrFailedPrecondition, "sandbox %q has already stopped; create a new one", s.id)
	}
	p, err := s.pod.Start(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.proc, s.started = p, true
	s.mu.Unlock()
	if p != nil {
		go s.monitor(p)
	}
	return s.startResponse(p), nil
}

func (s *Service) startResponse(p Process) *sandboxapi.StartSandboxResponse {
	if p == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return &sandboxapi.StartSandboxResponse{CreatedAt: timestamppb.New(s.createdAt)}
	}
	return &sandboxapi.StartSandboxResponse{Pid: uint32(p.Pid()), CreatedAt: timestamppb.New(p.StartedAt().UTC())}
}

func (s *Service) monitor(p Process) {
	<-p.Done()
	st, at, _ := p.Exited()
	s.log.Info("sandbox process exited", "pid", p.Pid(), "exit_status", st)
	s.finish(st, at)
}

// finish records the sandbox's end once and wakes WaitSandbox callers.
func (s *Service) finish(exitStatus uint32, at time.Time) {
	s.finishOnce.Do(func() {
		at = at.UTC()
		s.mu.Lock()
		s.exitStatus, s.exitedAt = exitStatus, at
		s.mu.Unlock()
		s.pod.Exited(exitStatus, at)
		close(s.done)
	})
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Platform is the shim's: linux and the architecture it was built for.
func (s *Service) Platform(ctx context.Context, req *sandboxapi.PlatformRequest) (*sandboxapi.PlatformResponse, error) {
	if req.GetSandboxID() != "" && req.GetSandboxID() != s.id {
		return nil, s.notThis(req.GetSandboxID())
	}
	return &sandboxapi.PlatformResponse{Platform: &types.Platform{OS: "linux", Architecture: runtime.GOARCH}}, nil
}

// StopSandbox stops the pod's process (SIGTERM, SIGKILL after timeout_secs) and has the
// Pod release what it held. Stopping a stopped sandbox succeeds.
func (s *Service) StopSandbox(ctx context.Context, req *sandboxapi.StopSandboxRequest) (*sandboxapi.StopSandboxResponse, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if err := s.lookup(req.GetSandboxID()); err != nil {
		return nil, err
	}
	if err := s.stop(ctx, time.Duration(req.GetTimeoutSecs())*time.Second); err != nil {
		return nil, err
	}
	return &sandboxapi.StopSandboxResponse{}, nil
}

// stop must be called with opMu held.
func (s *Service) stop(ctx context.Context, grace time.Duration) error {
	s.mu.Lock()
	p := s.proc
	s.stopped = true
	s.mu.Unlock()
	if p != nil {
		if err := p.Stop(ctx, grace); err != nil {
			return Errorf(errdefs.ErrInternal, "stop sandbox %q: %v", s.id, err)
		}
		// The monitor records the exit; wait so that a status right after this call
		// already shows it.
		<-s.done
	} else {
		s.finish(0, time.Now())
	}
	if err := s.pod.Stop(ctx); err != nil {
		return err
	}
	s.log.Info("sandbox stopped", "grace", grace.String())
	return nil
}

// WaitSandbox blocks until the sandbox has exited or ctx ends.
func (s *Service) WaitSandbox(ctx context.Context, req *sandboxapi.WaitSandboxRequest) (*sandboxapi.WaitSandboxResponse, error) {
	if err := s.lookup(req.GetSandboxID()); err != nil {
		return nil, err
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &sandboxapi.WaitSandboxResponse{ExitStatus: s.exitStatus, ExitedAt: timestamppb.New(s.exitedAt)}, nil
}

// SandboxStatus reports whether the pod runs, its process and the Pod's info.
func (s *Service) SandboxStatus(ctx context.Context, req *sandboxapi.SandboxStatusRequest) (*sandboxapi.SandboxStatusResponse, error) {
	if err := s.lookup(req.GetSandboxID()); err != nil {
		return nil, err
	}
	info := s.pod.Info(req.GetVerbose())
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &sandboxapi.SandboxStatusResponse{
		SandboxID: s.id,
		State:     StateNotReady,
		CreatedAt: timestamppb.New(s.createdAt),
		Info:      info,
	}
	if s.started {
		if s.proc != nil {
			resp.Pid = uint32(s.proc.Pid())
			resp.CreatedAt = timestamppb.New(s.proc.StartedAt().UTC())
		}
		if !isDone(s.done) {
			resp.State = StateReady
		}
	}
	if isDone(s.done) {
		resp.ExitedAt = timestamppb.New(s.exitedAt)
	}
	return resp, nil
}

// SandboxMetrics reports the Pod's metrics.
func (s *Service) SandboxMetrics(ctx context.Context, req *sandboxapi.SandboxMetricsRequest) (*sandboxapi.SandboxMetricsResponse, error) {
	if err := s.lookup(req.GetSandboxID()); err != nil {
		return nil, err
	}
	a, err := s.pod.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	return &sandboxapi.SandboxMetricsResponse{Metrics: &types.Metric{Timestamp: timestamppb.New(time.Now()), ID: s.id, Data: a}}, nil
}

// PingSandbox answers as long as the shim serves.
func (s *Service) PingSandbox(ctx context.Context, req *sandboxapi.PingRequest) (*sandboxapi.PingResponse, error) {
	if req.GetSandboxID() != "" && req.GetSandboxID() != s.id {
		return nil, s.notThis(req.GetSandboxID())
	}
	return &sandboxapi.PingResponse{}, nil
}

// ShutdownSandbox stops everything, then lets the shim exit once the reply is sent. The
// shim exits even when cleanup failed (the error is returned): a later `delete`
// repeats the cleanup.
func (s *Service) ShutdownSandbox(ctx context.Context, req *sandboxapi.ShutdownSandboxRequest) (*sandboxapi.ShutdownSandboxResponse, error) {
	if req.GetSandboxID() != s.id {
		return nil, s.notThis(req.GetSandboxID())
	}
	err := s.Shutdown(ctx)
	s.beforeReply()
	// ttrpc cancels a request's context only after its connection loop has taken the
	// reply for writing, so exiting from there cannot cut the reply off (closing the
	// server any earlier races with the reply: ttrpc may see the connection as idle).
	context.AfterFunc(ctx, s.afterReply)
	if err != nil {
		return nil, err
	}
	return &sandboxapi.ShutdownSandboxResponse{}, nil
}

// Shutdown stops the pod's process at once and has the Pod release everything. It is
// what a signal ending the shim does too.
func (s *Service) Shutdown(ctx context.Context) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if !s.Created() {
		return nil
	}
	return errors.Join(s.stop(ctx, 0), s.pod.Remove(ctx))
}

// UpdateSandbox is not implemented.
func (s *Service) UpdateSandbox(ctx context.Context, req *sandboxapi.UpdateSandboxRequest) (*sandboxapi.UpdateSandboxResponse, error) {
	return nil, Errorf(errdefs.ErrNotImplemented, "UpdateSandbox is not implemented by %s", s.name)
}

// Pid is the pod's process, once StartSandbox has started one.
func (s *Service) Pid() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0, false
	}
	return s.proc.Pid(), true
}

// Created tells whether CreateSandbox made a sandbox on this shim.
func (s *Service) Created() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created
}
