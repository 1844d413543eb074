package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	"github.com/crisp-runtime/crisp/api/containerd/types"
	"github.com/crisp-runtime/crisp/internal/cgstats"
	"github.com/crisp-runtime/crisp/internal/podfiles"
	"github.com/crisp-runtime/crisp/internal/proc"
	"github.com/crisp-runtime/crisp/internal/tracing"
	"github.com/crisp-runtime/crisp/shim/pause"
)

// Sandbox states reported by SandboxStatus, as containerd's CRI spells them.
const (
	StateReady    = "SANDBOX_READY"
	StateNotReady = "SANDBOX_NOTREADY"
)

// Config wires a Service to its shim.
type Config struct {
	// ID is the shim's -id: the one sandbox this shim serves.
	ID string
	// Bundle is the directory sandbox.json is written to.
	Bundle string
	Logger *slog.Logger
	// Runner starts and waits for the pause process (the shim's reaper).
	Runner pause.Runner
	// BeforeShutdownReply runs when ShutdownSandbox has cleaned up, before it replies
	// (the shim removes its socket there).
	BeforeShutdownReply func()
	// AfterShutdownReply runs once the reply to ShutdownSandbox has been handed to the
	// transport (the shim exits then); it must not block.
	AfterShutdownReply func()
}

// Service implements containerd.runtime.sandbox.v1.Sandbox for one pod.
type Service struct {
	id          string
	bundle      string
	log         *slog.Logger
	runner      pause.Runner
	beforeReply func()
	afterReply  func()

	// opMu serialises lifecycle operations and is held across their slow steps;
	// mu guards sb's fields and is never held across anything slow, so status and
	// wait calls are not blocked by a stop in progress.
	opMu sync.Mutex
	mu   sync.Mutex
	sb   *sandbox
	// writeMu orders sandbox.json writes so that the last write has the latest state.
	writeMu sync.Mutex
}

type sandbox struct {
	spec  podSpec
	state State
	// files are the pod's /etc files and /dev/shm the shim made (containerd's shim
	// sandboxer), nil when the caller makes its own.
	files   *podfiles.Paths
	cg      cgroups.Manager
	pause   *pause.Process
	stopped bool
	// metrics is the cgroup SandboxMetrics reads, loaded on its first call; guarded
	// by Service.mu.
	metrics *cgstats.Cgroup

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
		bundle:      cfg.Bundle,
		log:         log.With("sandbox", cfg.ID),
		runner:      cfg.Runner,
		beforeReply: cfg.BeforeShutdownReply,
		afterReply:  cfg.AfterShutdownReply,
	}
	if s.beforeReply == nil {
		s.beforeReply = func() {}
	}
	if s.afterReply == nil {
		s.afterReply = func() {}
	}
	return s
}

func (s *Service) lookup(id string) (*sandbox, error) {
	if id != s.id {
		return nil, kindf(errdefs.ErrNotFound, "sandbox %q not found: this shim serves %q", id, s.id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sb == nil {
		return nil, kindf(errdefs.ErrNotFound, "sandbox %q not created yet", id)
	}
	return s.sb, nil
}

// CreateSandbox validates the pod's options, creates its cgroup and records it.
func (s *Service) CreateSandbox(ctx context.Context, req *sandboxapi.CreateSandboxRequest) (_ *sandboxapi.CreateSandboxResponse, retErr error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if req.GetSandboxID() != s.id {
		return nil, invalid("sandbox id %q: this shim was started for %q", req.GetSandboxID(), s.id)
	}
	s.mu.Lock()
	exists := s.sb != nil
	s.mu.Unlock()
	if exists {
		return nil, kindf(errdefs.ErrAlreadyExists, "sandbox %q already created", s.id)
	}
	opts, files, err := unpackOptions(req.GetOptions())
	if err != nil {
		return nil, err
	}
	if n := len(req.GetRootfs()); n > 0 {
		// The pause process is this binary; there is no sandbox image to mount
		// (containerd's shim sandboxer sends none either).
		s.log.Warn("CreateSandbox rootfs mounts ignored", "mounts", n)
	}
	spec, err := buildSpec(req.GetSandboxID(), req.GetNetnsPath(), opts)
	if err != nil {
		return nil, err
	}
	m, err := spec.cgroup.manager()
	if err != nil {
		return nil, kindf(errdefs.ErrFailedPrecondition, "%v", err)
	}
	var paths *podfiles.Paths
	if files != nil {
		p, err := s.writePodFiles(spec, *files)
		if err != nil {
			return nil, err
		}
		paths = &p
		defer func() {
			if retErr != nil {
				// removePodFiles logs its own failure; the create's error is the one to return.
				_ = s.removePodFiles()
			}
		}()
	}
	// A systemd scope cannot exist without a process in it, so that driver creates
	// the cgroup in StartSandbox together with the pause process.
	if spec.cgroup.Driver == DriverCgroupfs {
		_, span := tracing.Start(ctx, "shim.cgroup.create", attribute.String("crisp.cgroup", spec.cgroup.String()))
		err := m.Apply(-1)
		tracing.End(span, err)
		if err != nil {
			// Apply may have created the cgroup in some hierarchies before failing.
			if derr := destroyCgroup(m, s.log); derr != nil {
				s.log.Error("remove partly created pod cgroup", "error", derr)
			}
			return nil, kindf(errdefs.ErrInternal, "create pod cgroup %s: %v", spec.cgroup, err)
		}
	}
	sb := &sandbox{
		spec:  spec,
		cg:    m,
		files: paths,
		done:  make(chan struct{}),
		state: State{
			SandboxID:  spec.id,
			BundlePath: req.GetBundlePath(),
			NetNSPath:  spec.netnsPath,
			Cgroup:     spec.cgroup,
			CreatedAt:  time.Now().UTC(),
		},
	}
	s.mu.Lock()
	s.sb = sb
	s.mu.Unlock()
	if err := s.persist(sb); err != nil {
		s.mu.Lock()
		s.sb = nil
		s.mu.Unlock()
		if derr := destroyCgroup(m, s.log); derr != nil {
			s.log.Error("remove pod cgroup after failed create", "error", derr)
		}
		return nil, kindf(errdefs.ErrInternal, "%v", err)
	}
	s.log.Info("sandbox created", "cgroup", spec.cgroup.String(), "netns", spec.netnsPath, "namespaces", spec.modes)
	return &sandboxapi.CreateSandboxResponse{}, nil
}

// StartSandbox starts the pause process, puts it in the pod cgroup and records it.
func (s *Service) StartSandbox(ctx context.Context, req *sandboxapi.StartSandboxRequest) (*sandboxapi.StartSandboxResponse, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	sb, err := s.lookup(req.GetSandboxID())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	p, stopped := sb.pause, sb.stopped
	s.mu.Unlock()
	if p != nil && !stopped && !isDone(sb.done) {
		return &sandboxapi.StartSandboxResponse{Pid: uint32(p.Pid()), CreatedAt: timestamppb.New(p.StartedAt())}, nil
	}
	if stopped || p != nil {
		return nil, kindf(errdefs.ErrFailedPrecondition, "sandbox %q has already stopped; create a new one", s.id)
	}

	spec := sb.spec
	cfg := pause.Config{
		NetNSPath: spec.netnsPath,
		Hostname:  spec.hostname,
		Sysctls:   spec.sysctls,
		NewIPC:    spec.newIPC,
		NewUTS:    spec.newUTS,
		NewPID:    spec.newPID,
		NewNet:    spec.newNet,
		UserNS:    spec.userns,
		Runner:    s.runner,

		SELinuxLabel: spec.selinuxLabel,
	}
	if spec.joinUserNS {
		cfg.UserNS, cfg.JoinUserNS = nil, true
	}
	floor, err := proc.OOMScoreAdj(0)
	if err != nil {
		return nil, kindf(errdefs.ErrInternal, "%v", err)
	}
	score, clamped := proc.ClampOOMScoreAdj(spec.oomScore, floor)
	if clamped {
		// Going below the shim's own score needs CAP_SYS_RESOURCE, which the shim may lack.
		s.log.Warn("oom_score_adj clamped to the shim's own", "requested", spec.oomScore, "applied", score)
	}
	cfg.OOMScoreAdj = &score
	pctx, span := tracing.Start(ctx, "shim.pause.start")
	p, err = pause.Start(pctx, cfg)
	if err != nil && cfg.SELinuxLabel != "" {
		// In the pod's label the pause could not report ready (the policy refused it
		// the shim's pipe): it starts again in the shim's domain.
		s.log.Warn("the pause process cannot run with the pod's SELinux label; it keeps the shim's", "label", cfg.SELinuxLabel, "error", err)
		cfg.SELinuxLabel = ""
		p, err = pause.Start(pctx, cfg)
	}
	tracing.End(span, err)
	if err == nil && cfg.SELinuxLabel != "" {
		if got := p.Label(); got != cfg.SELinuxLabel {
			s.log.Warn("the pause process keeps the shim's SELinux domain: the policy refused it the pod's label (crisp's policy module allows the shim's domain that transition)", "label", cfg.SELinuxLabel, "running_as", got)
		}
	}
	if err != nil {
		return nil, kindf(errdefs.ErrInternal, "start sandbox %q: %v", s.id, err)
	}
	pid := p.Pid()
	fail := func(kind messageKind, format string, args ...any) (*sandboxapi.StartSandboxResponse, error) {
		if err := p.Stop(context.WithoutCancel(ctx), 0); err != nil {
			s.log.Error("kill pause process after failed start", "pid", pid, "error", err)
		}
		return nil, kindf(kind, format, args...)
	}
	if spec.joinUserNS {
		// The joined user namespace is the caller's: it must map what the pod asked for.
		if err := checkIDMaps(pid, *spec.userns); err != nil {
			return fail(errdefs.ErrInvalidArgument, "sandbox %q: the user namespace owning netns_path %q %v", s.id, spec.netnsPath, err)
		}
	}
	st, err := proc.ReadStat(pid)
	if err != nil {
		return fail(errdefs.ErrInternal, "identify pause process: %v", err)
	}
	_, span = tracing.Start(ctx, "shim.cgroup.apply", attribute.String("crisp.cgroup", spec.cgroup.String()),
		attribute.String("crisp.cgroup.driver", spec.cgroup.Driver))
	err = sb.cg.Apply(pid)
	tracing.End(span, err)
	if err != nil {
		return fail(errdefs.ErrInternal, "put pause process %d into cgroup %s: %v", pid, spec.cgroup, err)
	}

	started := p.StartedAt().UTC()
	s.mu.Lock()
	sb.pause = p
	sb.state.PausePid, sb.state.PauseStartTime, sb.state.StartedAt = pid, st.StartTime, &started
	s.mu.Unlock()
	if err := s.persist(sb); err != nil {
		// Without the record a dead shim's pause could not be cleaned up.
		s.mu.Lock()
		sb.pause, sb.stopped = nil, false
		s.mu.Unlock()
		return fail(errdefs.ErrInternal, "%v", err)
	}
	go s.monitor(sb, p)
	s.log.Info("sandbox started", "pause_pid", pid, "oom_score_adj", score)
	return &sandboxapi.StartSandboxResponse{Pid: uint32(pid), CreatedAt: timestamppb.New(started)}, nil
}

func (s *Service) monitor(sb *sandbox, p *pause.Process) {
	<-p.Done()
	st, at, _ := p.Exited()
	s.log.Info("pause process exited", "pid", p.Pid(), "exit_status", st)
	s.finish(sb, st, at)
}

// finish records the sandbox's end once and wakes WaitSandbox callers.
func (s *Service) finish(sb *sandbox, exitStatus uint32, at time.Time) {
	sb.finishOnce.Do(func() {
		at = at.UTC()
		s.mu.Lock()
		sb.exitStatus, sb.exitedAt = exitStatus, at
		sb.state.ExitStatus, sb.state.ExitedAt = &exitStatus, &at
		s.mu.Unlock()
		if err := s.persist(sb); err != nil {
			s.log.Error("record sandbox exit", "error", err)
		}
		close(sb.done)
	})
}

func (s *Service) persist(sb *sandbox) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	st := sb.state
	s.mu.Unlock()
	return writeState(s.bundle, &st)
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Platform reports the platform containers of this sandbox run on.
func (s *Service) Platform(ctx context.Context, req *sandboxapi.PlatformRequest) (*sandboxapi.PlatformResponse, error) {
	if req.GetSandboxID() != "" && req.GetSandboxID() != s.id {
		return nil, kindf(errdefs.ErrNotFound, "sandbox %q not found: this shim serves %q", req.GetSandboxID(), s.id)
	}
	return &sandboxapi.PlatformResponse{Platform: &types.Platform{OS: "linux", Architecture: runtime.GOARCH}}, nil
}

// StopSandbox stops the pause process (SIGTERM, SIGKILL after timeout_secs) and removes
// the pod cgroup. Stopping a stopped sandbox succeeds.
func (s *Service) StopSandbox(ctx context.Context, req *sandboxapi.StopSandboxRequest) (*sandboxapi.StopSandboxResponse, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	sb, err := s.lookup(req.GetSandboxID())
	if err != nil {
		return nil, err
	}
	if err := s.stop(ctx, sb, time.Duration(req.GetTimeoutSecs())*time.Second); err != nil {
		return nil, err
	}
	return &sandboxapi.StopSandboxResponse{}, nil
}

// stop must be called with opMu held.
func (s *Service) stop(ctx context.Context, sb *sandbox, grace time.Duration) error {
	s.mu.Lock()
	p := sb.pause
	sb.stopped = true
	s.mu.Unlock()
	if p != nil {
		if err := p.Stop(ctx, grace); err != nil {
			return kindf(errdefs.ErrInternal, "stop sandbox %q: %v", s.id, err)
		}
		// The monitor records the exit; wait so that a status right after this call
		// already shows it.
		<-sb.done
	} else {
		s.finish(sb, 0, time.Now())
	}
	if err := destroyCgroup(sb.cg, s.log); err != nil {
		return kindf(errdefs.ErrInternal, "stop sandbox %q: %v", s.id, err)
	}
	s.log.Info("sandbox stopped", "grace", grace.String())
	return nil
}

// WaitSandbox blocks until the sandbox has exited or ctx ends.
func (s *Service) WaitSandbox(ctx context.Context, req *sandboxapi.WaitSandboxRequest) (*sandboxapi.WaitSandboxResponse, error) {
	sb, err := s.lookup(req.GetSandboxID())
	if err != nil {
		return nil, err
	}
	select {
	case <-sb.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &sandboxapi.WaitSandboxResponse{ExitStatus: sb.exitStatus, ExitedAt: timestamppb.New(sb.exitedAt)}, nil
}

// SandboxStatus reports whether the pause process runs, plus pids and cgroup in info.
func (s *Service) SandboxStatus(ctx context.Context, req *sandboxapi.SandboxStatusRequest) (*sandboxapi.SandboxStatusResponse, error) {
	sb, err := s.lookup(req.GetSandboxID())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &sandboxapi.SandboxStatusResponse{
		SandboxID: s.id,
		State:     StateNotReady,
		CreatedAt: timestamppb.New(sb.state.CreatedAt),
		Info: map[string]string{
			"shim_pid":  strconv.Itoa(os.Getpid()),
			"cgroup":    sb.spec.cgroup.String(),
			"pause_pid": "0",
		},
	}
	if sb.pause != nil {
		resp.Pid = uint32(sb.pause.Pid())
		resp.Info["pause_pid"] = strconv.Itoa(sb.pause.Pid())
		resp.CreatedAt = timestamppb.New(*sb.state.StartedAt)
		if !isDone(sb.done) {
			resp.State = StateReady
		}
	}
	if isDone(sb.done) {
		resp.ExitedAt = timestamppb.New(sb.exitedAt)
	}
	if req.GetVerbose() {
		resp.Info["namespaces"] = sb.spec.modes
		resp.Info["netns_path"] = sb.spec.netnsPath
		resp.Info["hostname"] = sb.spec.hostname
		if u := sb.spec.userns; u != nil {
			resp.Info["userns"] = fmt.Sprintf("uid=0:%d:%d,gid=0:%d:%d", u.UID.HostID, u.UID.Size, u.GID.HostID, u.GID.Size)
		}
		resp.Info["bundle"] = s.bundle
		resp.Info["cgroup_driver"] = sb.spec.cgroup.Driver
		resp.Info["pause_start_time"] = strconv.FormatUint(sb.state.PauseStartTime, 10)
		// For operators and leak tests: a shim's goroutines and heap should return to
		// their idle level once its streams and execs are gone.
		resp.Info["goroutines"] = strconv.Itoa(runtime.NumGoroutine())
		for k, v := range goMemory() {
			resp.Info[k] = v
		}
	}
	return resp, nil
}

// PingSandbox answers as long as the shim serves.
func (s *Service) PingSandbox(ctx context.Context, req *sandboxapi.PingRequest) (*sandboxapi.PingResponse, error) {
	if req.GetSandboxID() != "" && req.GetSandboxID() != s.id {
		return nil, kindf(errdefs.ErrNotFound, "sandbox %q not found: this shim serves %q", req.GetSandboxID(), s.id)
	}
	return &sandboxapi.PingResponse{}, nil
}

// ShutdownSandbox stops everything, then lets the shim exit once the reply is sent. The
// shim exits even when cleanup failed (the error is returned): a later `shim-runc
// delete` repeats the cleanup from sandbox.json.
func (s *Service) ShutdownSandbox(ctx context.Context, req *sandboxapi.ShutdownSandboxRequest) (*sandboxapi.ShutdownSandboxResponse, error) {
	if req.GetSandboxID() != s.id {
		return nil, kindf(errdefs.ErrNotFound, "sandbox %q not found: this shim serves %q", req.GetSandboxID(), s.id)
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

// Shutdown kills the pause process (no grace: nothing in it needs one) and removes the
// pod cgroup. It is what SIGTERM to the shim does too.
func (s *Service) Shutdown(ctx context.Context) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil {
		return nil
	}
	err := s.stop(ctx, sb, 0)
	if sb.files != nil {
		// After the pause: the containers that bind-mount them are gone by now.
		err = errors.Join(err, s.removePodFiles())
	}
	return err
}

// UpdateSandbox is not implemented yet.
func (s *Service) UpdateSandbox(ctx context.Context, req *sandboxapi.UpdateSandboxRequest) (*sandboxapi.UpdateSandboxResponse, error) {
	return nil, errdefs.ErrNotImplemented.WithMessage("UpdateSandbox is not implemented by crisp-shim-runc")
}

// Exit is what `delete` reports for a dead shim's sandbox.
type Exit struct {
	Pid      uint32
	Status   uint32
	ExitedAt time.Time
}

// killedStatus is what a SIGKILLed process reports (128+9), as containerd's shims do.
const killedStatus = 137

// Cleanup removes what a dead shim left behind according to dir/sandbox.json: it kills
// the pause process if its pid still names the same process, and removes the pod cgroup.
// Running it again is harmless.
func Cleanup(ctx context.Context, dir string, log *slog.Logger) (Exit, error) {
	st, err := ReadState(dir)
	if errors.Is(err, os.ErrNotExist) {
		// The shim died before CreateSandbox: there is nothing of the pod to remove.
		return Exit{Status: killedStatus, ExitedAt: time.Now().UTC()}, nil
	}
	if err != nil {
		return Exit{}, err
	}
	var errs []error
	if st.PausePid > 0 {
		killed, err := proc.KillVerified(st.PausePid, st.PauseStartTime, 10*time.Second)
		if err != nil {
			errs = append(errs, err)
		}
		if killed {
			log.Info("killed pause process of dead shim", "pid", st.PausePid)
			now := time.Now().UTC()
			status := uint32(killedStatus)
			st.ExitStatus, st.ExitedAt = &status, &now
		}
	}
	if st.Cgroup.Driver != "" {
		m, err := st.Cgroup.manager()
		if err == nil {
			err = destroyCgroup(m, log)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if st.ExitedAt == nil {
		now := time.Now().UTC()
		status := uint32(killedStatus)
		st.ExitStatus, st.ExitedAt = &status, &now
	}
	if err := podfiles.Remove(filepath.Join(dir, podFilesDir)); err != nil {
		errs = append(errs, err)
	}
	if err := writeState(dir, st); err != nil {
		errs = append(errs, err)
	}
	return Exit{Pid: uint32(st.PausePid), Status: *st.ExitStatus, ExitedAt: *st.ExitedAt}, errors.Join(errs...)
}

// Pid is the pod's pause process, once StartSandbox has started it.
func (s *Service) Pid() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sb == nil || s.sb.pause == nil {
		return 0, false
	}
	return s.sb.pause.Pid(), true
}

// podFilesDir is where, in the shim's bundle, the pod's files and /dev/shm are.
const podFilesDir = "pod"

// writePodFiles writes the files containerd's podsandbox would give the pod's
// containers, and mounts its /dev/shm when the pod has an IPC namespace of its own.
func (s *Service) writePodFiles(spec podSpec, pod podfiles.Pod) (podfiles.Paths, error) {
	if pod.Hostname == "" {
		// The pod keeps the host's UTS namespace: its hostname is the host's.
		h, err := os.Hostname()
		if err != nil {
			return podfiles.Paths{}, kindf(errdefs.ErrInternal, "pod files: %v", err)
		}
		pod.Hostname = h
	}
	dir := filepath.Join(s.bundle, podFilesDir)
	if err := podfiles.Write(dir, pod); err != nil {
		return podfiles.Paths{}, kindf(errdefs.ErrInternal, "pod files: %v", err)
	}
	if spec.newIPC {
		if err := podfiles.MountShm(filepath.Join(dir, podfiles.ShmDir), ""); err != nil {
			_ = podfiles.Remove(dir)
			return podfiles.Paths{}, kindf(errdefs.ErrInternal, "%v", err)
		}
	}
	return podfiles.In(dir, spec.newIPC), nil
}

func (s *Service) removePodFiles() error {
	if err := podfiles.Remove(filepath.Join(s.bundle, podFilesDir)); err != nil {
		s.log.Error("remove pod files", "error", err)
		return kindf(errdefs.ErrInternal, "%v", err)
	}
	return nil
}

// PodFiles are the pod's files for its containers' bind mounts, when this shim made
// them (under containerd's shim sandboxer); false otherwise.
func (s *Service) PodFiles() (podfiles.Paths, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sb == nil || s.sb.files == nil {
		return podfiles.Paths{}, false
	}
	return *s.sb.files, true
}

// Created tells whether CreateSandbox made a sandbox on this shim.
func (s *Service) Created() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sb != nil
}
