package pod

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

	"github.com/crisp-runtime/crisp/internal/cgstats"
	"github.com/crisp-runtime/crisp/internal/podfiles"
	"github.com/crisp-runtime/crisp/internal/proc"
	"github.com/crisp-runtime/crisp/internal/tracing"
	"github.com/crisp-runtime/crisp/pkg/shimkit/pause"
	kitsandbox "github.com/crisp-runtime/crisp/pkg/shimkit/sandbox"
)

// Sandbox states reported by SandboxStatus, as containerd's CRI spells them.
const (
	StateReady    = kitsandbox.StateReady
	StateNotReady = kitsandbox.StateNotReady
)

// Config wires a Pod to its shim.
type Config struct {
	// ID is the shim's -id: the one sandbox this shim serves.
	ID string
	// Bundle is the directory sandbox.json is written to.
	Bundle string
	Logger *slog.Logger
	// Runner starts and waits for the pause process (the shim's reaper).
	Runner pause.Runner
}

// Pod is crisp's pod for the kit's sandbox service (pkg/shimkit/sandbox): the pause
// process holding the pod's namespaces, the pod cgroup, the pod's files under
// containerd's shim sandboxer, and sandbox.json, which `delete` and recovery read.
type Pod struct {
	id     string
	bundle string
	log    *slog.Logger
	runner pause.Runner

	// mu guards sb's fields; the kit's service serialises the lifecycle calls.
	mu sync.Mutex
	sb *sandbox
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
	// by Pod.mu.
	metrics *cgstats.Cgroup
}

var _ kitsandbox.Pod = (*Pod)(nil)

// New returns the pod; nothing happens until Create.
func New(cfg Config) *Pod {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Pod{id: cfg.ID, bundle: cfg.Bundle, log: log.With("sandbox", cfg.ID), runner: cfg.Runner}
}

// Create validates the pod's options, creates its cgroup and records it.
func (s *Pod) Create(ctx context.Context, req *kitsandbox.CreateRequest) (retErr error) {
	opts, files, err := unpackOptions(req.Options)
	if err != nil {
		return err
	}
	if n := len(req.Rootfs); n > 0 {
		// The pause process is this binary; there is no sandbox image to mount
		// (containerd's shim sandboxer sends none either).
		s.log.Warn("CreateSandbox rootfs mounts ignored", "mounts", n)
	}
	spec, err := buildSpec(req.ID, req.NetNSPath, opts)
	if err != nil {
		return err
	}
	m, err := spec.cgroup.manager()
	if err != nil {
		return kindf(errdefs.ErrFailedPrecondition, "%v", err)
	}
	var paths *podfiles.Paths
	if files != nil {
		p, err := s.writePodFiles(spec, *files)
		if err != nil {
			return err
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
	// the cgroup in Start together with the pause process.
	if spec.cgroup.Driver == DriverCgroupfs {
		_, span := tracing.Start(ctx, "shim.cgroup.create", attribute.String("crisp.cgroup", spec.cgroup.String()))
		err := m.Apply(-1)
		tracing.End(span, err)
		if err != nil {
			// Apply may have created the cgroup in some hierarchies before failing.
			if derr := destroyCgroup(m, s.log); derr != nil {
				s.log.Error("remove partly created pod cgroup", "error", derr)
			}
			return kindf(errdefs.ErrInternal, "create pod cgroup %s: %v", spec.cgroup, err)
		}
	}
	sb := &sandbox{
		spec:  spec,
		cg:    m,
		files: paths,
		state: State{
			SandboxID:  spec.id,
			BundlePath: req.BundlePath,
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
		return kindf(errdefs.ErrInternal, "%v", err)
	}
	s.log.Info("sandbox created", "cgroup", spec.cgroup.String(), "netns", spec.netnsPath, "namespaces", spec.modes)
	return nil
}

// Start starts the pause process, puts it in the pod cgroup and records it.
func (s *Pod) Start(ctx context.Context) (kitsandbox.Process, error) {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
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
	p, err := pause.Start(pctx, cfg)
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
	fail := func(kind messageKind, format string, args ...any) (kitsandbox.Process, error) {
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
	s.log.Info("sandbox started", "pause_pid", pid, "oom_score_adj", score)
	return p, nil
}

// Exited records the sandbox's end in sandbox.json.
func (s *Pod) Exited(exitStatus uint32, at time.Time) {
	s.mu.Lock()
	sb := s.sb
	sb.state.ExitStatus, sb.state.ExitedAt = &exitStatus, &at
	s.mu.Unlock()
	if err := s.persist(sb); err != nil {
		s.log.Error("record sandbox exit", "error", err)
	}
}

func (s *Pod) persist(sb *sandbox) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	st := sb.state
	s.mu.Unlock()
	return writeState(s.bundle, &st)
}

// Stop removes the pod cgroup once the pause process is gone.
func (s *Pod) Stop(ctx context.Context) error {
	s.mu.Lock()
	sb := s.sb
	sb.stopped = true
	s.mu.Unlock()
	if err := destroyCgroup(sb.cg, s.log); err != nil {
		return kindf(errdefs.ErrInternal, "stop sandbox %q: %v", s.id, err)
	}
	return nil
}

// Remove removes the pod's files, after its containers (which bind-mount them) and the
// pause process are gone.
func (s *Pod) Remove(ctx context.Context) error {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil || sb.files == nil {
		return nil
	}
	return s.removePodFiles()
}

// Info is SandboxStatus's info: the shim and pause pids and the cgroup, and verbose,
// the namespaces, the netns, the bundle and the shim's Go memory.
func (s *Pod) Info(verbose bool) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sb
	info := map[string]string{
		"shim_pid":  strconv.Itoa(os.Getpid()),
		"cgroup":    sb.spec.cgroup.String(),
		"pause_pid": "0",
	}
	if sb.pause != nil {
		info["pause_pid"] = strconv.Itoa(sb.pause.Pid())
	}
	if verbose {
		info["namespaces"] = sb.spec.modes
		info["netns_path"] = sb.spec.netnsPath
		info["hostname"] = sb.spec.hostname
		if u := sb.spec.userns; u != nil {
			info["userns"] = fmt.Sprintf("uid=0:%d:%d,gid=0:%d:%d", u.UID.HostID, u.UID.Size, u.GID.HostID, u.GID.Size)
		}
		info["bundle"] = s.bundle
		info["cgroup_driver"] = sb.spec.cgroup.Driver
		info["pause_start_time"] = strconv.FormatUint(sb.state.PauseStartTime, 10)
		// For operators and leak tests: a shim's goroutines and heap should return to
		// their idle level once its streams and execs are gone.
		info["goroutines"] = strconv.Itoa(runtime.NumGoroutine())
		for k, v := range goMemory() {
			info[k] = v
		}
	}
	return info
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

// podFilesDir is where, in the shim's bundle, the pod's files and /dev/shm are.
const podFilesDir = "pod"

// writePodFiles writes the files containerd's podsandbox would give the pod's
// containers, and mounts its /dev/shm when the pod has an IPC namespace of its own.
func (s *Pod) writePodFiles(spec podSpec, pod podfiles.Pod) (podfiles.Paths, error) {
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

func (s *Pod) removePodFiles() error {
	if err := podfiles.Remove(filepath.Join(s.bundle, podFilesDir)); err != nil {
		s.log.Error("remove pod files", "error", err)
		return kindf(errdefs.ErrInternal, "%v", err)
	}
	return nil
}

// PodFiles are the pod's files for its containers' bind mounts, when this shim made
// them (under containerd's shim sandboxer); false otherwise.
func (s *Pod) PodFiles() (podfiles.Paths, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sb == nil || s.sb.files == nil {
		return podfiles.Paths{}, false
	}
	return *s.sb.files, true
}
