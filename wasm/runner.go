package wasm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/crisp-runtime/crisp/internal/atomicfile"
	"github.com/crisp-runtime/crisp/internal/mount"
	"github.com/crisp-runtime/crisp/internal/spawn"
	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
	"github.com/crisp-runtime/crisp/wasm/run"
)

// RunArg is the hidden first argument that makes the shim binary a container's
// process: `shim-wasm _run [--cache-dir DIR] BUNDLE`, its stdio the container's, fd 3
// the pipe Start writes to (see RunChild).
const RunArg = "_run"

// startFD is where the child finds the pipe it waits on until Start.
const startFD = 3

// Config wires a Runner to its shim.
type Config struct {
	// StateDir holds a record per container (its cgroup and rootfs), what `delete`
	// reads after a dead shim. Owned by this shim.
	StateDir string
	// CacheDir holds compiled modules shared between containers (and pods): "" is none.
	CacheDir string
	Logger   *slog.Logger
	// Binary is run as the container's process (RunArg); "" is the running binary.
	Binary string
}

// Runner runs a pod's containers as WASI modules, each in a child process of the shim
// (wasm/run with wazero) in the container's cgroup: task.Runner.
type Runner struct {
	cfg Config
	log *slog.Logger

	mu         sync.Mutex
	containers map[string]*container
}

// container is what the Runner holds of one container.
type container struct {
	rec   record
	cg    cgroups.Manager
	start *os.File // the write end of the start pipe, until Start
}

// record is a container's state file: what `delete` needs after a dead shim.
type record struct {
	Cgroup containerCgroup `json:"cgroup"`
	// Rootfs is the directory Create mounted the root filesystem at, "" if none.
	Rootfs string `json:"rootfs,omitempty"`
}

var (
	_ task.Runner      = (*Runner)(nil)
	_ task.OOMReporter = (*Runner)(nil)
)

// NewRunner returns the runner; it creates the state dir.
func NewRunner(cfg Config) (*Runner, error) {
	if !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("wasm runner: state dir %q must be absolute", cfg.StateDir)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("wasm runner: %w", err)
	}
	if cfg.CacheDir != "" {
		if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
			return nil, fmt.Errorf("wasm runner: compilation cache: %w", err)
		}
	}
	if cfg.Binary == "" {
		// Not os.Executable's path: /proc/self/exe stays this binary even once an
		// upgrade has replaced the file.
		cfg.Binary = "/proc/self/exe"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Runner{cfg: cfg, log: log, containers: map[string]*container{}}, nil
}

func invalid(format string, args ...any) error {
	return task.Errorf(errdefs.ErrInvalidArgument, format, args...)
}

func internal(format string, args ...any) error {
	return task.Errorf(errdefs.ErrInternal, format, args...)
}

// Create mounts the rootfs, checks the module, and starts the container's process,
// which waits for Start before it loads the module.
func (r *Runner) Create(ctx context.Context, req *task.CreateRequest) (_ *task.Created, retErr error) {
	if req.Terminal {
		return nil, invalid("container %q: a WebAssembly module has no terminal", req.ID)
	}
	if req.Checkpoint != "" {
		return nil, task.Errorf(errdefs.ErrNotImplemented, "container %q: WebAssembly containers cannot be restored from a checkpoint", req.ID)
	}
	spec, err := task.LoadSpec(req.Bundle)
	if err != nil {
		return nil, invalid("container %q: %v", req.ID, err)
	}
	if spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return nil, invalid("container %q: the spec names no linux.cgroupsPath", req.ID)
	}
	if slices.ContainsFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.UserNamespace }) {
		// The module's process runs as the shim's user (Features lists no namespace):
		// what it wrote would belong to the host's root, not the pod's mapped IDs.
		return nil, task.Errorf(errdefs.ErrNotImplemented, "container %q: WebAssembly containers cannot run in a user namespace (hostUsers: false)", req.ID)
	}
	cgPath, err := parseCgroupsPath(spec.Linux.CgroupsPath)
	if err != nil {
		return nil, invalid("container %q: %v", req.ID, err)
	}
	rec := record{Cgroup: cgPath}
	if len(req.Rootfs) > 0 {
		root := spec.Root.Path
		if !filepath.IsAbs(root) {
			root = filepath.Join(req.Bundle, root)
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, internal("container %q: rootfs: %v", req.ID, err)
		}
		ms := make([]mount.Mount, 0, len(req.Rootfs))
		for _, m := range req.Rootfs {
			ms = append(ms, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
		}
		if err := mount.All(ms, root); err != nil {
			return nil, internal("container %q: mount rootfs: %v", req.ID, err)
		}
		rec.Rootfs = root
		defer func() {
			if retErr != nil {
				if err := mount.Unmount(root); err != nil {
					r.log.Error("unmount rootfs after failed create", "container", req.ID, "error", err)
				}
			}
		}()
	}
	// The module is found and checked now, so that a bad one fails CreateContainer
	// with its reason instead of exiting 126 at start.
	if _, err := run.Load(req.Bundle); err != nil {
		return nil, invalid("container %q: %v", req.ID, err)
	}
	if err := r.writeRecord(req.ID, rec); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			_ = os.Remove(r.recordPath(req.ID))
		}
	}()
	cg, err := cgPath.manager()
	if err != nil {
		return nil, internal("container %q: cgroup: %v", req.ID, err)
	}
	startR, startW, err := os.Pipe()
	if err != nil {
		return nil, internal("container %q: %v", req.ID, err)
	}
	defer func() { _ = startR.Close() }()
	args := []string{RunArg, "--oom-file", r.oomPath(req.ID)}
	if r.cfg.CacheDir != "" {
		args = append(args, "--cache-dir", r.cfg.CacheDir)
	}
	cmd := exec.Command(r.cfg.Binary, append(args, req.Bundle)...)
	cmd.Args[0] = os.Args[0]
	cmd.Dir = req.Bundle
	cmd.Env = []string{"GOMAXPROCS=1"}
	// Set one by one: a nil *os.File in an io.Reader is not a nil Reader to exec.
	if req.Stdio.Stdin != nil {
		cmd.Stdin = req.Stdio.Stdin
	}
	if req.Stdio.Stdout != nil {
		cmd.Stdout = req.Stdio.Stdout
	}
	if req.Stdio.Stderr != nil {
		cmd.Stderr = req.Stdio.Stderr
	}
	cmd.ExtraFiles = []*os.File{startR}
	// The module dies with the shim: a dead shim's `delete` finds nothing running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: true}
	if err := spawn.Do(cmd.Start); err != nil {
		_ = startW.Close()
		return nil, internal("container %q: start: %v", req.ID, err)
	}
	pid := cmd.Process.Pid
	// The shim's subreaper reaps it; the task service waits on its pidfd.
	_ = cmd.Process.Release()
	if err := cg.Apply(pid); err != nil {
		_ = startW.Close()
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = cg.Destroy()
		return nil, internal("container %q: put its process into cgroup %s: %v", req.ID, spec.Linux.CgroupsPath, err)
	}
	stats, serr := cgPath.statsPath()
	info := &task.CgroupInfo{Paths: cg.GetPaths(), Stats: stats}
	if serr != nil {
		info.StatsErr = serr.Error()
	}
	r.mu.Lock()
	r.containers[req.ID] = &container{rec: rec, cg: cg, start: startW}
	r.mu.Unlock()
	return &task.Created{Pid: pid, PrivatePID: true, Rootfs: rec.Rootfs, Cgroup: info}, nil
}

// Start lets the container's process load and run its module.
func (r *Runner) Start(_ context.Context, id string, exited <-chan struct{}) error {
	r.mu.Lock()
	c := r.containers[id]
	r.mu.Unlock()
	if c == nil || c.start == nil {
		return task.Errorf(errdefs.ErrFailedPrecondition, "start container %q: not created or already started", id)
	}
	select {
	case <-exited:
		return task.Errorf(errdefs.ErrFailedPrecondition, "start container %q: its process is already dead", id)
	default:
	}
	_, err := c.start.Write([]byte{0})
	_ = c.start.Close()
	c.start = nil
	if err != nil {
		return task.Errorf(errdefs.ErrFailedPrecondition, "start container %q: %v", id, err)
	}
	return nil
}

// Exec is not supported: a WebAssembly container runs its one module.
func (r *Runner) Exec(_ context.Context, req *task.ExecRequest) (int, error) {
	return 0, task.Errorf(errdefs.ErrNotImplemented, "exec in container %q: a WebAssembly container runs one module, nothing can be executed in it", req.ID)
}

// Update is not supported: the module's memory limit is fixed when it is instantiated.
func (r *Runner) Update(_ context.Context, id string, _ []byte) error {
	return task.Errorf(errdefs.ErrNotImplemented, "update container %q: a WebAssembly module's memory limit is set when it starts", id)
}

// Delete removes the container's cgroup, unmounts its rootfs and forgets it.
func (r *Runner) Delete(_ context.Context, id, rootfs string) error {
	r.mu.Lock()
	c := r.containers[id]
	delete(r.containers, id)
	r.mu.Unlock()
	var errs []error
	if c != nil {
		if c.start != nil {
			// Never started: EOF at its pipe ends it.
			_ = c.start.Close()
		}
		if err := destroyCgroup(c.cg); err != nil {
			errs = append(errs, err)
		}
	}
	if rootfs != "" {
		if err := mount.Unmount(rootfs); err != nil {
			errs = append(errs, fmt.Errorf("unmount rootfs: %w", err))
		}
	}
	for _, p := range []string{r.oomPath(id), r.recordPath(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return internal("delete container %q: %v", id, err)
	}
	return nil
}

// destroyCgroup kills what is left in the cgroup and removes it.
func destroyCgroup(cg cgroups.Manager) error {
	if !cg.Exists() {
		return nil
	}
	if pids, err := cg.GetAllPids(); err == nil {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return cg.Destroy()
}

// OOMKilled reports whether the container's module exited over its memory limit:
// the `_run` child created its oom file then (task.OOMReporter).
func (r *Runner) OOMKilled(id string, status uint32) bool {
	if status != run.ExitMemoryLimit {
		return false
	}
	_, err := os.Stat(r.oomPath(id))
	return err == nil
}

// oomPath is the file container id's `_run` creates when its module exceeds its
// memory limit.
func (r *Runner) oomPath(id string) string {
	return filepath.Join(r.cfg.StateDir, id+".oom")
}

func (r *Runner) recordPath(id string) string {
	return filepath.Join(r.cfg.StateDir, id+".json")
}

func (r *Runner) writeRecord(id string, rec record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return internal("container %q: %v", id, err)
	}
	if err := atomicfile.Write(r.recordPath(id), data, 0o600); err != nil {
		return internal("container %q: record: %v", id, err)
	}
	return nil
}

// CleanupDead removes what the containers of a dead shim left, from the records in
// stateDir: their processes (killed through their cgroups), cgroups and rootfs mounts.
// Running it twice is harmless.
func CleanupDead(stateDir string, log *slog.Logger) error {
	entries, err := os.ReadDir(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		p := filepath.Join(stateDir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var rec record
		if err := json.Unmarshal(data, &rec); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		if cg, err := rec.Cgroup.manager(); err == nil {
			if err := destroyCgroup(cg); err != nil {
				errs = append(errs, err)
			}
		}
		if rec.Rootfs != "" {
			if err := mount.Unmount(rec.Rootfs); err != nil {
				errs = append(errs, err)
			}
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		} else {
			log.Info("cleaned up container of dead shim", "record", p)
		}
	}
	return errors.Join(errs...)
}

// RunChild is the `_run` child: it waits for Start (a byte on fd 3; EOF means the
// container was deleted unstarted) and then runs the module (run.Main).
func RunChild(args []string) int {
	f := os.NewFile(startFD, "start")
	if f == nil {
		fmt.Fprintln(os.Stderr, "wasm: no start pipe on fd 3")
		return run.ExitUsage
	}
	var b [1]byte
	n, _ := f.Read(b[:])
	_ = f.Close()
	if n != 1 {
		// Deleted before Start: nothing ran.
		return run.ExitCannotRun
	}
	return run.Main(args)
}
