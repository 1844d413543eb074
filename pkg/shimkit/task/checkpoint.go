package task

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	taskv3 "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	taskapi "github.com/crisp-runtime/crisp/api/containerd/types/task"
	"github.com/crisp-runtime/crisp/pkg/shimkit/events"
)

// CheckpointOptionsTypeURL is the type of the options Checkpoint accepts: containerd's
// runc shim options, so containerd's CRI plugin and crisp's controller send the same.
const CheckpointOptionsTypeURL = "type.googleapis.com/containerd.runc.v1.CheckpointOptions"

// checkpointOptions is containerd.runc.v1.CheckpointOptions. It is decoded by hand: the
// generated package would add a proto registry entry and its init to every pod's shim
// for nine scalar fields.
type checkpointOptions struct {
	exit, openTCP, externalUnixSockets, terminal, fileLocks bool
	emptyNamespaces                                         []string
	cgroupsMode, imagePath, workPath                        string
}

func decodeCheckpointOptions(a *anypb.Any) (checkpointOptions, error) {
	var o checkpointOptions
	if a == nil || a.GetTypeUrl() == "" {
		return o, nil
	}
	if a.GetTypeUrl() != CheckpointOptionsTypeURL && !strings.HasSuffix(a.GetTypeUrl(), "/containerd.runc.v1.CheckpointOptions") {
		return o, fmt.Errorf("options must be containerd.runc.v1.CheckpointOptions, got %q", a.GetTypeUrl())
	}
	b := a.GetValue()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return o, fmt.Errorf("decode checkpoint options: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num >= 1 && num <= 5 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return o, fmt.Errorf("decode checkpoint options: %w", protowire.ParseError(n))
			}
			b = b[n:]
			*[]*bool{&o.exit, &o.openTCP, &o.externalUnixSockets, &o.terminal, &o.fileLocks}[num-1] = v != 0 //nolint:gosec // G602: the case admits num 1..5 only
		case num >= 6 && num <= 10 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return o, fmt.Errorf("decode checkpoint options: %w", protowire.ParseError(n))
			}
			b = b[n:]
			switch num {
			case 6:
				o.emptyNamespaces = append(o.emptyNamespaces, string(v))
			case 7:
				o.cgroupsMode = string(v)
			case 8:
				o.imagePath = string(v)
			case 9:
				o.workPath = string(v)
			case 10:
				return o, errors.New("parent_path (pre-dump) is not supported")
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return o, fmt.Errorf("decode checkpoint options: %w", protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return o, nil
}

// emptyNamespaceFlags maps the option's namespace names to clone flags; CRIU then
// restores those namespaces empty instead of from the images.
func emptyNamespaceFlags(names []string) (uint32, error) {
	var flags uint32
	for _, n := range names {
		switch n {
		case "network":
			flags |= unix.CLONE_NEWNET
		default:
			return 0, fmt.Errorf("empty namespace %q: only \"network\" is supported", n)
		}
	}
	return flags, nil
}

// Checkpoint dumps a running container (the runner's Checkpointer: CRIU for runc) into
// the request's path; with options.exit the container is stopped afterwards, else it keeps
// running (what CRI-O and containerd's CRI do for kubelet's forensic checkpoints).
func (s *Service) Checkpoint(ctx context.Context, req *taskv3.CheckpointTaskRequest) (*emptypb.Empty, error) {
	cp, ok := s.runner.(Checkpointer)
	if !ok {
		return nil, unimplemented("checkpoint container %q: this shim cannot checkpoint containers", req.GetID())
	}
	c, err := s.get(req.GetID())
	if err != nil {
		return nil, err
	}
	opts, err := decodeCheckpointOptions(req.GetOptions())
	if err != nil {
		return nil, invalid("checkpoint container %q: %v", c.id, err)
	}
	images := req.GetPath()
	if opts.imagePath != "" {
		images = opts.imagePath
	}
	if !filepath.IsAbs(images) {
		return nil, invalid("checkpoint container %q: image path %q must be absolute", c.id, images)
	}
	if opts.workPath != "" && !filepath.IsAbs(opts.workPath) {
		return nil, invalid("checkpoint container %q: work path %q must be absolute", c.id, opts.workPath)
	}
	emptyNS, err := emptyNamespaceFlags(opts.emptyNamespaces)
	if err != nil {
		return nil, invalid("checkpoint container %q: %v", c.id, err)
	}
	if err := c.lockLive(); err != nil {
		return nil, err
	}
	defer c.opMu.Unlock()
	if st, _, _ := c.init.state(); st != taskapi.Status_RUNNING {
		return nil, failedPrecondition("container %q is not running: only running containers can be checkpointed", c.id)
	}
	if !c.privatePID {
		// CRIU dumps a process tree from the root of its PID namespace; a namespace
		// shared with the pod's other processes would need all of them.
		return nil, failedPrecondition("container %q shares a PID namespace: checkpoint needs the container's own (CRI pid namespace mode CONTAINER)", c.id)
	}
	// CRIU cannot be interrupted half-way without leaving the container frozen, so the
	// deadline is checked before it starts.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	creq := &CheckpointRequest{
		ID:           c.id,
		Images:       images,
		Work:         opts.workPath,
		LeaveRunning: !opts.exit,
		TCP:          opts.openTCP,
		ExtUnix:      opts.externalUnixSockets,
		// A container with a terminal is a shell job to CRIU: its pty's session leader
		// is outside the dumped tree.
		ShellJob:    opts.terminal || c.init.io.terminal,
		FileLocks:   opts.fileLocks,
		EmptyNS:     emptyNS,
		CgroupsMode: opts.cgroupsMode,
	}
	start := time.Now()
	// When ctx ends the runner stops the dump and thaws the container (a CRIU that
	// hangs would otherwise hold the container's lock for good).
	if err := cp.Checkpoint(ctx, creq); err != nil {
		return nil, err
	}
	c.log.Info("container checkpointed", "images", images, "leave_running", !opts.exit, "duration", time.Since(start))
	s.events.Publish(events.TaskCheckpointed{ContainerID: c.id, Checkpoint: images})
	s.releaseMemory()
	return &emptypb.Empty{}, nil
}

// Pause freezes every process of a running container (its freezer cgroup).
// CheckpointPod pauses all the containers it captures before it dumps any, so that the
// pod's checkpoint is one cut; CRIU dumps a frozen container and leaves it frozen.
func (s *Service) Pause(ctx context.Context, req *taskv3.PauseRequest) (*emptypb.Empty, error) {
	pr, ok := s.runner.(Pauser)
	if !ok {
		return nil, unimplemented("pause container %q: this shim cannot pause containers", req.GetID())
	}
	c, err := s.getLocked(req.GetID())
	if err != nil {
		return nil, err
	}
	defer c.opMu.Unlock()
	if st, _, _ := c.init.state(); st != taskapi.Status_RUNNING {
		return nil, failedPrecondition("container %q is not running: only running containers can be paused", c.id)
	}
	if err := pr.Pause(context.Background(), c.id); err != nil {
		return nil, err
	}
	c.paused.Store(true)
	c.log.Info("container paused")
	s.events.Publish(events.TaskPaused{ContainerID: c.id})
	return &emptypb.Empty{}, nil
}

// Resume thaws a paused container. Resuming a container that is not paused (or whose
// freezer a timed-out checkpoint already thawed) succeeds: callers resume on every
// path out of a pod checkpoint and must be able to repeat it.
func (s *Service) Resume(ctx context.Context, req *taskv3.ResumeRequest) (*emptypb.Empty, error) {
	pr, ok := s.runner.(Pauser)
	if !ok {
		return nil, unimplemented("resume container %q: this shim cannot pause containers", req.GetID())
	}
	c, err := s.getLocked(req.GetID())
	if err != nil {
		return nil, err
	}
	defer c.opMu.Unlock()
	if err := pr.Resume(context.Background(), c.id); err != nil {
		return nil, err
	}
	if c.paused.Swap(false) {
		c.log.Info("container resumed")
		s.events.Publish(events.TaskResumed{ContainerID: c.id})
	}
	return &emptypb.Empty{}, nil
}

// restoreSpec is what a container created from a checkpoint keeps until Start restores
// it (see newContainerFromCheckpoint).
type restoreSpec struct {
	images string
}

// startRestore restores c's processes from its checkpoint through the runner (for
// runc: CRIU in a helper, libcontainer's Restore): they join the container's new cgroup, the pod's network
// namespace (the dumped one is external, CRIU gets the new one as an inherited fd) and
// its IPC and UTS namespaces, and their stdout and stderr become the pipes to the CRI log
// (CRIU maps the dumped pipe inodes from descriptors.json onto the fds it is given).
// opMu is held.
func (s *Service) startRestore(ctx context.Context, c *container) (*taskv3.StartResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := c.init
	var child Stdio
	sio, err := openStdio(p.io, &child, c.log)
	if err != nil {
		return nil, internal("container %q: %v", c.id, err)
	}
	start := time.Now()
	sub := s.reaper.Subscribe()
	defer sub.Close()
	// Create with a checkpoint checked that the runner is a Checkpointer.
	resp, err := s.runner.(Checkpointer).Restore(context.Background(), &RestoreRequest{
		ID: c.id, Bundle: c.bundle, Terminal: p.io.terminal, Checkpoint: c.restore.images, Stdio: child,
	})
	if err != nil {
		sio.abort()
		return nil, err
	}
	pid := resp.Pid
	ws, exited := s.reaper.Claim(sub, pid)
	sub.Close()
	c.mu.Lock()
	c.cgInfo = resp.Cgroup
	c.mu.Unlock()
	startErr := p.setStarted(pid, sio, ws, exited)
	if startErr != nil {
		c.killAll(unix.SIGKILL)
	}
	if err := sio.started(); startErr == nil {
		startErr = err
	}
	if startErr == nil {
		c.oom = s.watchOOM(c)
	}
	p.setRunning()
	c.restore = nil
	go c.waitInit()
	if startErr != nil {
		_ = p.signal(unix.SIGKILL)
		return nil, internal("container %q: %v", c.id, startErr)
	}
	c.log.Info("container restored", "pid", pid, "duration", time.Since(start))
	s.releaseMemory()
	return &taskv3.StartResponse{Pid: uint32(pid)}, nil
}

// abandonRestore records a container created from a checkpoint and deleted before it
// was restored as exited: nothing ran, so nothing else will record it.
func (c *container) abandonRestore() {
	if pid, _ := c.init.started(); pid == 0 && c.restore != nil && !c.init.exited() {
		c.init.setExited(0, time.Now())
	}
}
