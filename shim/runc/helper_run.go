package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	// Registers the device-rule backend that the cgroup v1 devices controller needs.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/runc/libcontainer"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/crisp-runtime/crisp/internal/cgstats"
	"github.com/crisp-runtime/crisp/internal/mount"
	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

// RunHelper is `shim-runc _task ACTION ID` (see HelperArg): it decodes the request from
// stdin, does the action with libcontainer and writes the response to stdout. It
// returns the process's exit code: 0 once a response is written, whether the action
// succeeded or not (the response says), 1 if none could be.
func RunHelper(args []string, stdin io.Reader, stdout io.Writer, log *slog.Logger) int {
	resp := helperMain(args, stdin, log)
	if err := json.NewEncoder(stdout).Encode(resp); err != nil {
		log.Error("task helper: write response", "error", err)
		return 1
	}
	return 0
}

func helperMain(args []string, stdin io.Reader, log *slog.Logger) *helperResponse {
	var req helperRequest
	resp, err := func() (*helperResponse, error) {
		if len(args) < 1 {
			return nil, internal("task helper: no action")
		}
		if err := json.NewDecoder(stdin).Decode(&req); err != nil {
			return nil, internal("task helper: decode request: %v", err)
		}
		if !filepath.IsAbs(req.Root) || !task.ValidID(req.ID) {
			return nil, internal("task helper: bad state root %q or container id %q", req.Root, req.ID)
		}
		log := log.With("helper", args[0], "container", req.ID)
		switch args[0] {
		case helperCreate:
			return helperCreateContainer(&req, log)
		case helperExec:
			return helperExecProcess(&req)
		case helperRestore:
			return helperRestoreContainer(&req, log)
		case helperUpdate:
			return &helperResponse{}, helperUpdateResources(&req)
		case helperCheckpoint:
			return &helperResponse{}, helperCheckpointContainer(&req, log)
		case helperPause, helperResume:
			return &helperResponse{}, helperFreeze(&req, args[0] == helperPause)
		case helperDelete:
			return &helperResponse{}, helperDestroy(&req, log)
		}
		return nil, internal("task helper: unknown action %q", args[0])
	}()
	if err != nil {
		// The answer carries the kind as its gRPC code; an error of no kind is Internal.
		code, ok := task.CodeOf(err)
		if !ok || code == codes.Unknown {
			code = codes.Internal
		}
		return &helperResponse{Code: uint32(code), Error: err.Error()}
	}
	return resp
}

// stdioFiles gives lp the stdio the shim passed. They are inherited without
// close-on-exec, which would leak them into every process libcontainer starts beyond
// the ones it hands them to on purpose.
func stdioFiles(lp *libcontainer.Process, fds helperStdio) {
	file := func(fd int, name string) *os.File {
		if fd < 3 {
			return nil
		}
		unix.CloseOnExec(fd)
		return os.NewFile(uintptr(fd), name)
	}
	if f := file(fds.Stdin, "stdin"); f != nil {
		lp.Stdin = f
	}
	if f := file(fds.Stdout, "stdout"); f != nil {
		lp.Stdout = f
	}
	if f := file(fds.Stderr, "stderr"); f != nil {
		lp.Stderr = f
	}
	if f := file(fds.ConsoleSocket, "console-socket"); f != nil {
		lp.ConsoleSocket = f
	}
}

// helperCreateContainer mounts the rootfs, creates the libcontainer container and
// starts its init up to libcontainer's exec fifo (as `runc create`); for a container
// restored from a checkpoint it stops after the create. On error it undoes all of it.
func helperCreateContainer(req *helperRequest, log *slog.Logger) (_ *helperResponse, retErr error) {
	id, bundle := req.ID, req.Bundle
	spec, err := task.LoadSpec(bundle)
	if err != nil {
		return nil, invalid("container %q: %v", id, err)
	}
	// The request says whether there is a terminal (containerd does the same).
	spec.Process.Terminal = req.Terminal
	resp := &helperResponse{PrivatePID: privatePIDNamespace(spec)}
	if req.Checkpoint != "" && !resp.PrivatePID {
		return nil, invalid("container %q restores a checkpoint: it needs its own PID namespace (CRI pid namespace mode CONTAINER)", id)
	}
	// What an earlier shim of this pod left under the id goes first: its rootfs is
	// where this one is mounted.
	if err := destroyContainer(req.Root, id, "", true, true, log); err != nil {
		return nil, internal("container %q: %v", id, err)
	}
	rootfs := rootfsPath(bundle, spec)
	if len(req.Rootfs) > 0 {
		if err := os.MkdirAll(rootfs, 0o711); err != nil {
			return nil, internal("create rootfs dir: %v", err)
		}
		mounts := make([]mount.Mount, 0, len(req.Rootfs))
		for _, m := range req.Rootfs {
			mounts = append(mounts, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
		}
		if err := mountRootfs(spec, mounts, rootfs); err != nil {
			_ = os.Remove(rootfs)
			return nil, internal("mount rootfs of container %q: %v", id, err)
		}
		resp.Rootfs = rootfs
		defer func() {
			if retErr != nil {
				if err := mount.Unmount(rootfs); err != nil {
					log.Error("unmount rootfs after failed create", "error", err)
				} else {
					_ = os.Remove(rootfs)
				}
			}
		}()
	}
	cfg, err := libcontainerConfig(id, bundle, spec)
	if err != nil {
		return nil, invalid("convert spec of container %q: %v", id, err)
	}
	lc, err := libcontainer.Create(req.Root, id, cfg)
	if err != nil {
		if errors.Is(err, libcontainer.ErrExist) {
			return nil, alreadyExists("container %q already exists", id)
		}
		return nil, invalid("create container %q: %v", id, err)
	}
	defer func() {
		if retErr != nil {
			if err := destroyLibcontainer(lc); err != nil {
				log.Error("destroy container after failed create", "error", err)
			}
		}
	}()
	if req.Checkpoint != "" {
		// Restored by Start, as containerd's runc shim does.
		resp.Cgroup = cgroupOf(lc)
		return resp, nil
	}
	lp, err := newProcess(spec.Process)
	if err != nil {
		return nil, invalid("container %q: %v", id, err)
	}
	lp.Init = true
	stdioFiles(lp, req.Stdio)
	if err := lc.Start(lp); err != nil {
		return nil, internal("start init of container %q: %v", id, err)
	}
	resp.Pid, err = lp.Pid()
	if err != nil {
		return nil, internal("start init of container %q: %v", id, err)
	}
	resp.Cgroup = cgroupOf(lc)
	return resp, nil
}

// helperExecProcess starts an exec in a container (as `runc exec --detach`).
func helperExecProcess(req *helperRequest) (*helperResponse, error) {
	var spec specs.Process
	if err := json.Unmarshal(req.Process, &spec); err != nil {
		return nil, invalid("decode exec spec: %v", err)
	}
	spec.Terminal = req.Terminal
	lp, err := newProcess(&spec)
	if err != nil {
		return nil, invalid("exec %q: %v", req.ExecID, err)
	}
	lp.Init = false
	lc, err := libcontainer.Load(req.Root, req.ID)
	if err != nil {
		return nil, internal("exec %q in container %q: %v", req.ExecID, req.ID, err)
	}
	stdioFiles(lp, req.Stdio)
	if err := lc.Run(lp); err != nil {
		return nil, internal("exec %q in container %q: %v", req.ExecID, req.ID, err)
	}
	pid, err := lp.Pid()
	if err != nil {
		return nil, internal("exec %q in container %q: %v", req.ExecID, req.ID, err)
	}
	return &helperResponse{Pid: pid}, nil
}

// helperRestoreContainer restores a created container's processes from its checkpoint
// with CRIU: CRIU restores them as its siblings, children of the helper, and they are
// re-parented to the shim (the subreaper) when the helper exits. libcontainer keeps a
// created container that never started in memory only (no state.json), so the one the
// create helper made is created again from the bundle here.
func helperRestoreContainer(req *helperRequest, log *slog.Logger) (_ *helperResponse, retErr error) {
	spec, err := task.LoadSpec(req.Bundle)
	if err != nil {
		return nil, invalid("container %q: %v", req.ID, err)
	}
	spec.Process.Terminal = req.Terminal
	cfg, err := libcontainerConfig(req.ID, req.Bundle, spec)
	if err != nil {
		return nil, invalid("convert spec of container %q: %v", req.ID, err)
	}
	lp, err := newProcess(spec.Process)
	if err != nil {
		return nil, invalid("container %q: %v", req.ID, err)
	}
	lp.Init = true
	if _, err := os.Stat(filepath.Join(req.Root, req.ID, "state.json")); errors.Is(err, os.ErrNotExist) {
		if err := os.RemoveAll(filepath.Join(req.Root, req.ID)); err != nil {
			return nil, internal("restore container %q: %v", req.ID, err)
		}
	}
	lc, err := libcontainer.Create(req.Root, req.ID, cfg)
	if err != nil {
		return nil, internal("restore container %q: %v", req.ID, err)
	}
	defer func() {
		if retErr != nil {
			// What the restore made (the cgroup) goes; a retried Start creates it anew.
			if err := destroyLibcontainer(lc); err != nil {
				log.Error("destroy container after failed restore", "error", err)
			}
		}
	}()
	stdioFiles(lp, req.Stdio)
	criuOpts := &libcontainer.CriuOpts{
		ImagesDirectory: req.Checkpoint,
		ShellJob:        req.Terminal,
		StatusFd:        -1,
	}
	if err := lc.Restore(lp, criuOpts); err != nil {
		return nil, failedPrecondition("restore container %q with CRIU: %v%s",
			req.ID, err, criuLogErrors(filepath.Join(req.Checkpoint, "restore.log")))
	}
	pid, err := lp.Pid()
	if err != nil {
		return nil, internal("restore container %q: %v", req.ID, err)
	}
	return &helperResponse{Pid: pid, Cgroup: cgroupOf(lc)}, nil
}

// helperUpdateResources applies new cgroup resources, as `runc update`.
func helperUpdateResources(req *helperRequest) error {
	var r specs.LinuxResources
	if err := json.Unmarshal(req.Resources, &r); err != nil {
		return invalid("decode resources: %v", err)
	}
	lc, err := libcontainer.Load(req.Root, req.ID)
	if err != nil {
		return internal("update resources of container %q: %v", req.ID, err)
	}
	cfg := lc.Config()
	cg := *cfg.Cgroups
	res := updateResources(cg.Resources, &r)
	// Device rules are not part of an update (as in `runc update`); libcontainer does
	// not save this flag in the state.
	res.SkipDevices = true
	cg.Resources = res
	cfg.Cgroups = &cg
	if err := lc.Set(cfg); err != nil {
		return internal("update resources of container %q: %v", req.ID, err)
	}
	return nil
}

// helperCheckpointContainer dumps the container with CRIU. SIGTERM (the shim's request
// ended: its deadline passed or its caller went away) kills CRIU and thaws the container.
func helperCheckpointContainer(req *helperRequest, log *slog.Logger) error {
	o := req.Criu
	if o == nil {
		return invalid("checkpoint container %q: no CRIU options", req.ID)
	}
	lc, err := libcontainer.Load(req.Root, req.ID)
	if err != nil {
		return internal("checkpoint container %q: %v", req.ID, err)
	}
	ctx, stopSignals := signal.NotifyContext(context.Background(), unix.SIGTERM)
	defer stopSignals()
	criuOpts := &libcontainer.CriuOpts{
		ImagesDirectory:         o.Images,
		WorkDirectory:           o.Work,
		LeaveRunning:            o.LeaveRunning,
		TcpEstablished:          o.TCP,
		ExternalUnixConnections: o.ExtUnix,
		ShellJob:                o.ShellJob,
		FileLocks:               o.FileLocks,
		EmptyNs:                 o.EmptyNS,
		ManageCgroupsMode:       o.CgroupsMode,
		StatusFd:                -1,
	}
	// The deadline is enforced on CRIU itself: libcontainer's Checkpoint has no
	// context, and a CRIU that hangs (seen on Linux 6.18 with CRIU 4.1.1, in the
	// parasite's exit) would hold the container's lock for good.
	stopWatch := watchCRIU(ctx, lc, log)
	err = lc.Checkpoint(criuOpts)
	if timedOut := stopWatch(); timedOut {
		return task.Errorf(context.DeadlineExceeded, "checkpoint container %q: CRIU did not finish before the deadline and was killed%s",
			req.ID, criuLogTail(filepath.Join(criuLogDir(o.Images, o.Work), "dump.log")))
	}
	if err != nil {
		return internal("checkpoint container %q with CRIU: %v%s", req.ID, err, criuLogErrors(filepath.Join(criuLogDir(o.Images, o.Work), "dump.log")))
	}
	return nil
}

// helperFreeze pauses or resumes the container (its freezer cgroup). Resuming one that
// is not paused succeeds.
func helperFreeze(req *helperRequest, pause bool) error {
	lc, err := libcontainer.Load(req.Root, req.ID)
	if pause {
		if err == nil {
			err = lc.Pause()
		}
		if err != nil {
			return internal("pause container %q: %v", req.ID, err)
		}
		return nil
	}
	if err == nil {
		err = lc.Resume()
	}
	if err != nil && !errors.Is(err, libcontainer.ErrNotPaused) {
		return internal("resume container %q: %v", req.ID, err)
	}
	return nil
}

// helperDestroy destroys the container (see destroyContainer). After a create helper
// that died before it answered, the libcontainer state may not record the rootfs yet
// (or at all): the rootfs the bundle's spec names is unmounted too.
func helperDestroy(req *helperRequest, log *slog.Logger) error {
	if err := destroyContainer(req.Root, req.ID, req.RootfsDir, req.RootfsFromState, false, log); err != nil {
		return err
	}
	if req.RootfsFromState && req.Bundle != "" {
		if spec, err := task.LoadSpec(req.Bundle); err == nil {
			if err := mount.Unmount(rootfsPath(req.Bundle, spec)); err != nil {
				return fmt.Errorf("container %s: %w", req.ID, err)
			}
		}
	}
	return nil
}

// cgroupOf reports the container's cgroups for the shim.
func cgroupOf(lc *libcontainer.Container) *task.CgroupInfo {
	info := &task.CgroupInfo{}
	if st, err := lc.State(); err == nil {
		info.Paths = st.CgroupPaths
	}
	cfg := lc.Config().Cgroups
	if cfg == nil {
		info.StatsErr = "libcontainer config has no cgroup"
		return info
	}
	rel, err := cgstats.RelPath(cfg.Systemd, cfg.Path, cfg.Parent, cfg.ScopePrefix, cfg.Name)
	if err != nil {
		info.StatsErr = err.Error()
		return info
	}
	info.Stats = rel
	return info
}

// destroyLibcontainer removes the container's cgroup leaf and state. A process still
// leaving the cgroup makes removal fail with EBUSY for a moment, hence the retries.
func destroyLibcontainer(lc *libcontainer.Container) error {
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
		}
		if err = lc.Destroy(); err == nil {
			return nil
		}
	}
	return fmt.Errorf("destroy container %s: %w", lc.ID(), err)
}
