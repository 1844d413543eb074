package controller

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	options "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/fifoio"
)

// Task API service names: v3 is what crisp's clients are generated for, v2 what
// containerd 1.x shims (and CRI-O's VM runtime type) serve, with the same messages.
const (
	taskServiceV3 = "containerd.task.v3.Task"
	taskServiceV2 = "containerd.task.v2.Task"
)

// taskV2 rewrites calls of the task v3 service to v2, for shims whose start answered
// bootstrap version 2: the messages are the same on the wire.
func taskV2(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, _ *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	if req.Service == taskServiceV3 {
		req.Service = taskServiceV2
	}
	return invoke(ctx, req, resp)
}

// pauseStopGrace is how long StopSandbox waits for the pause container to exit after
// SIGKILL before it reports the failure.
const pauseStopGrace = 10 * time.Second

// taskSandbox serves the sandbox API on top of a task-only shim, the way containerd's
// podsandbox does: the sandbox is a pause container the shim runs like any other, with
// the sandbox's id. The controller drives it exactly as it drives a shim that serves
// the sandbox API itself; CreateSandbox expects the bundle written (pauseBundle.write).
type taskSandbox struct {
	tc taskapi.TTRPCTaskService
	// opts are the handler's runtime options, sent with every task Create.
	opts *anypb.Any
	// created is when StartSandbox started the pause container.
	created time.Time
	// version is the task API the shim serves (2 or 3).
	version int
}

var _ sandboxapi.TTRPCSandboxService = (*taskSandbox)(nil)

func (t *taskSandbox) CreateSandbox(ctx context.Context, req *sandboxapi.CreateSandboxRequest) (*sandboxapi.CreateSandboxResponse, error) {
	if _, err := t.tc.Create(ctx, &taskapi.CreateTaskRequest{ID: req.GetSandboxID(), Bundle: req.GetBundlePath(), Options: t.opts}); err != nil {
		return nil, err
	}
	return &sandboxapi.CreateSandboxResponse{}, nil
}

func (t *taskSandbox) StartSandbox(ctx context.Context, req *sandboxapi.StartSandboxRequest) (*sandboxapi.StartSandboxResponse, error) {
	resp, err := t.tc.Start(ctx, &taskapi.StartRequest{ID: req.GetSandboxID()})
	if err != nil {
		return nil, err
	}
	t.created = time.Now()
	return &sandboxapi.StartSandboxResponse{Pid: resp.GetPid(), CreatedAt: timestamppb.New(t.created)}, nil
}

func (t *taskSandbox) Platform(context.Context, *sandboxapi.PlatformRequest) (*sandboxapi.PlatformResponse, error) {
	return &sandboxapi.PlatformResponse{Platform: &types.Platform{OS: "linux"}}, nil
}

// StopSandbox kills the pause container (it holds nothing worth a graceful stop) and
// waits for it to exit.
func (t *taskSandbox) StopSandbox(ctx context.Context, req *sandboxapi.StopSandboxRequest) (*sandboxapi.StopSandboxResponse, error) {
	id := req.GetSandboxID()
	st, err := t.tc.State(ctx, &taskapi.StateRequest{ID: id})
	if err != nil {
		return nil, err
	}
	if st.GetStatus() == tasktypes.Status_STOPPED {
		return &sandboxapi.StopSandboxResponse{}, nil
	}
	if _, err := t.tc.Kill(ctx, &taskapi.KillRequest{ID: id, Signal: uint32(syscall.SIGKILL), All: true}); err != nil && !errdefs.IsNotFound(fromShim(err)) {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, pauseStopGrace)
	defer cancel()
	if _, err := t.tc.Wait(wctx, &taskapi.WaitRequest{ID: id}); err != nil && !errdefs.IsNotFound(fromShim(err)) {
		return nil, fmt.Errorf("wait for the pause container of pod %s: %w", id, err)
	}
	return &sandboxapi.StopSandboxResponse{}, nil
}

func (t *taskSandbox) WaitSandbox(ctx context.Context, req *sandboxapi.WaitSandboxRequest) (*sandboxapi.WaitSandboxResponse, error) {
	resp, err := t.tc.Wait(ctx, &taskapi.WaitRequest{ID: req.GetSandboxID()})
	if err != nil {
		return nil, err
	}
	return &sandboxapi.WaitSandboxResponse{ExitStatus: resp.GetExitStatus(), ExitedAt: resp.GetExitedAt()}, nil
}

func (t *taskSandbox) SandboxStatus(ctx context.Context, req *sandboxapi.SandboxStatusRequest) (*sandboxapi.SandboxStatusResponse, error) {
	id := req.GetSandboxID()
	st, err := t.tc.State(ctx, &taskapi.StateRequest{ID: id})
	if err != nil {
		return nil, err
	}
	state := "SANDBOX_NOTREADY"
	if st.GetStatus() == tasktypes.Status_RUNNING {
		state = "SANDBOX_READY"
	}
	resp := &sandboxapi.SandboxStatusResponse{SandboxID: id, Pid: st.GetPid(), State: state, ExitedAt: st.GetExitedAt()}
	if !t.created.IsZero() {
		resp.CreatedAt = timestamppb.New(t.created)
	}
	if req.GetVerbose() {
		resp.Info = map[string]string{
			"sandbox_mode": "task",
			"pause_status": st.GetStatus().String(),
			"pause_pid":    strconv.FormatUint(uint64(st.GetPid()), 10),
			"bundle":       st.GetBundle(),
		}
		resp.Info["task_api"] = strconv.Itoa(t.version)
		if c, err := t.tc.Connect(ctx, &taskapi.ConnectRequest{ID: id}); err == nil {
			resp.Info["shim_pid"] = strconv.FormatUint(uint64(c.GetShimPid()), 10)
			resp.Info["shim_version"] = c.GetVersion()
		}
	}
	return resp, nil
}

func (t *taskSandbox) PingSandbox(ctx context.Context, req *sandboxapi.PingRequest) (*sandboxapi.PingResponse, error) {
	if _, err := t.tc.Connect(ctx, &taskapi.ConnectRequest{ID: req.GetSandboxID()}); err != nil {
		return nil, err
	}
	return &sandboxapi.PingResponse{}, nil
}

// ShutdownSandbox deletes the pause container and asks the shim to exit; the shim
// exits once it runs no container, and the controller kills it if it does not.
func (t *taskSandbox) ShutdownSandbox(ctx context.Context, req *sandboxapi.ShutdownSandboxRequest) (*sandboxapi.ShutdownSandboxResponse, error) {
	id := req.GetSandboxID()
	if _, err := t.tc.Delete(ctx, &taskapi.DeleteRequest{ID: id}); err != nil && !errdefs.IsNotFound(fromShim(err)) {
		return nil, fmt.Errorf("delete the pause container of pod %s: %w", id, err)
	}
	if _, err := t.tc.Shutdown(ctx, &taskapi.ShutdownRequest{ID: id, Now: true}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
		return nil, err
	}
	return &sandboxapi.ShutdownSandboxResponse{}, nil
}

// SandboxMetrics reports the pause container's cgroup. The controller adds the pod's
// containers (see Controller.SandboxMetrics): a task-only shim knows no pod cgroup.
func (t *taskSandbox) SandboxMetrics(ctx context.Context, req *sandboxapi.SandboxMetricsRequest) (*sandboxapi.SandboxMetricsResponse, error) {
	resp, err := t.tc.Stats(ctx, &taskapi.StatsRequest{ID: req.GetSandboxID()})
	if err != nil {
		return nil, err
	}
	return &sandboxapi.SandboxMetricsResponse{Metrics: &types.Metric{Timestamp: timestamppb.Now(), ID: req.GetSandboxID(), Data: resp.GetStats()}}, nil
}

func (t *taskSandbox) UpdateSandbox(context.Context, *sandboxapi.UpdateSandboxRequest) (*sandboxapi.UpdateSandboxResponse, error) {
	return nil, fmt.Errorf("update of a task-only shim's sandbox: %w", errdefs.ErrNotImplemented)
}

// bootstrapFile is where criserver records a task-only shim's start answer, as
// containerd records it (containerd's shims keep no address file): recovery reads it
// when criserver died before the pod was recorded.
const bootstrapFile = "bootstrap.json"

type bootstrapRecord struct {
	Version  int    `json:"version"`
	Address  string `json:"address"`
	Protocol string `json:"protocol"`
}

func writeBootstrap(bundle, addr string, version int) error {
	data, err := json.Marshal(bootstrapRecord{Version: version, Address: addr, Protocol: "ttrpc"})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, bootstrapFile), data, 0o600)
}

// readBootstrap reads what writeBootstrap wrote; ok is false without it.
func readBootstrap(bundle string) (addr string, version int, ok bool) {
	data, err := os.ReadFile(filepath.Join(bundle, bootstrapFile))
	if err != nil {
		return "", 0, false
	}
	var r bootstrapRecord
	if json.Unmarshal(data, &r) != nil || r.Address == "" {
		return "", 0, false
	}
	return r.Address, r.Version, true
}

// settlePause waits, up to orphanCreateWait, for the shim to know the pause container
// of a pod whose start was cut short: a Create the dead criserver sent goes on in the
// shim, and a teardown that ran before it ended would leave the container behind. A
// create the shim never finished is cleaned up (see cleanAbortedCreate).
func (c *Controller) settlePause(ctx context.Context, sb *sandbox) {
	tc, _, err := c.task(sb.rec.ID)
	if err != nil || sb.rec.Pid != 0 {
		return
	}
	if awaitTask(ctx, tc, sb.rec.ID) {
		return
	}
	c.cleanAbortedCreate(ctx, sb, sb.rec.ID, sb.rec.Bundle)
}

// awaitTask polls the shim for task id for up to orphanCreateWait; false if the shim
// never knew it.
func awaitTask(ctx context.Context, tc taskapi.TTRPCTaskService, id string) bool {
	deadline := time.Now().Add(orphanCreateWait)
	for {
		_, err := tc.State(ctx, &taskapi.StateRequest{ID: id})
		if err == nil || !errdefs.IsNotFound(fromShim(err)) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cleanAbortedCreate removes what a create the shim never finished left: the shim
// cancels a Create whose caller went away, which kills runc in the middle of `runc
// create`, leaving its state dir (without state.json) and the cgroups it had made.
// The shim's delete command runs `runc delete --force`, which removes such a state
// dir; the cgroups, empty, are removed here (cgroupfs; under the systemd driver a
// scope without processes is collected by systemd).
func (c *Controller) cleanAbortedCreate(ctx context.Context, sb *sandbox, id, bundle string) {
	call := c.call(&sb.rec)
	call.id, call.bundle = id, bundle
	if _, err := call.delete(ctx); err != nil {
		c.log.Debug("delete of an unfinished create", "pod", sb.rec.ID, "id", id, "err", err)
		// containerd 1.x's runc shim records its runc only once the create succeeded,
		// so its delete cannot run after one that was cut short: ask runc directly.
		if err := c.runcDelete(ctx, sb, id); err != nil {
			c.log.Debug("runc delete of an unfinished create", "pod", sb.rec.ID, "id", id, "err", err)
		}
	}
	var spec struct {
		Linux struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	}
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil || json.Unmarshal(data, &spec) != nil {
		return
	}
	if n := removeEmptyCgroup(spec.Linux.CgroupsPath); n > 0 {
		c.log.Info("removed the cgroups of a create cut short", "pod", sb.rec.ID, "id", id, "cgroups", n)
	}
}

// runcDelete runs `runc delete --force id` with the runc and root a runc shim of sb's
// handler uses (its options' BinaryName and Root, in the shim's namespace); runc
// removes the state dir of a create it did not finish. Other shims: nothing to do.
func (c *Controller) runcDelete(ctx context.Context, sb *sandbox, id string) error {
	if !isRuncShim(sb.rec.Shim) {
		return nil
	}
	var o runcoptions.Options
	if a := c.taskOpts[sb.rec.Handler]; a != nil {
		if err := proto.Unmarshal(a.GetValue(), &o); err != nil {
			return fmt.Errorf("decode runc options: %w", err)
		}
	}
	bin, root := o.GetBinaryName(), o.GetRoot()
	if bin == "" {
		bin = "runc"
	}
	if root == "" {
		root = "/run/containerd/runc" // containerd's runc shims' default
	}
	out, err := exec.CommandContext(ctx, bin, "--root", filepath.Join(root, sb.rec.Namespace), "delete", "--force", id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s delete: %w: %s", bin, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeEmptyCgroup removes cgroupfs path (as in an OCI cgroupsPath) from every
// hierarchy under /sys/fs/cgroup where it exists and is empty; it never removes a
// cgroup that holds processes or children (rmdir fails on those). It returns how many
// it removed.
func removeEmptyCgroup(cgPath string) int {
	if !filepath.IsAbs(cgPath) || filepath.Clean(cgPath) != cgPath || cgPath == "/" {
		return 0 // a systemd slice:prefix:name, or nothing to remove
	}
	const root = "/sys/fs/cgroup"
	dirs := []string{root}
	if entries, err := os.ReadDir(root); err == nil {
		for _, e := range entries {
			if e.IsDir() {
				dirs = append(dirs, filepath.Join(root, e.Name()))
			}
		}
	}
	n := 0
	for _, d := range dirs {
		if os.Remove(filepath.Join(d, cgPath)) == nil {
			n++
		}
	}
	return n
}

// removeShimSockets removes the socket of a task-only shim whose address criserver
// never learnt (it died during the shim's start), where runtime-v2 shims put it:
// sha256 of "<address>/<namespace>/<id>" in the socket dir crisp gives, or in
// containerd's /run/containerd/s, where containerd 1.x shims always put theirs. The
// name is the pod's alone and its shim is gone by now (the `start` that made the
// socket may still hold it open for a moment, which is why nothing is dialled).
func (c *Controller) removeShimSockets(rec *record) {
	name := fmt.Sprintf("%x", sha256.Sum256([]byte(filepath.Join(c.opts.Address, rec.Namespace, rec.ID))))
	for _, dir := range []string{c.opts.socketDir(), "/run/containerd/s"} {
		p := filepath.Join(dir, name)
		if err := os.Remove(p); err == nil {
			c.log.Info("removed the socket of a shim whose start was cut short", "pod", rec.ID, "socket", p)
		}
	}
}

// taskShimPid asks a task-only shim for its pid (containerd's shims keep no pid file)
// and records it in the bundle as shim.pid, where crisp finds its own shim's; 0 if
// the shim does not answer.
func taskShimPid(ctx context.Context, tc taskapi.TTRPCTaskService, rec record) int {
	resp, err := tc.Connect(ctx, &taskapi.ConnectRequest{ID: rec.ID})
	if err != nil {
		return 0
	}
	pid := int(resp.GetShimPid())
	_ = os.WriteFile(filepath.Join(rec.Bundle, "shim.pid"), []byte(strconv.Itoa(pid)), 0o600)
	return pid
}

// prepareTaskShim readies the bundle of a task-only shim's pod before its start: the
// shim reads the pause container's spec at start (containerd's runc shim groups by its
// annotations) and logs to a FIFO someone must read (an adopted spare's is read
// already).
func (c *Controller) prepareTaskShim(sb *sandbox, spec Spec, adopted bool) error {
	if err := c.writePauseBundle(sb, spec); err != nil {
		return err
	}
	if adopted {
		return nil
	}
	if err := c.openShimLog(sb, true); err != nil {
		return fmt.Errorf("start shim for pod %s: %w", spec.ID, err)
	}
	return nil
}

// writePauseBundle writes the pause container's bundle of a task-only shim's pod.
func (c *Controller) writePauseBundle(sb *sandbox, spec Spec) error {
	opts := spec.Sandbox
	if opts == nil {
		opts = &options.SandboxOptions{}
	}
	pb := pauseBundle{
		id: spec.ID, name: spec.Name, namespace: spec.Namespace, uid: spec.UID, netns: sb.rec.NetNS,
		binary: c.opts.PauseBinary, cgroupsPath: spec.PauseCgroupsPath, annotations: maps.Clone(spec.Annotations), opts: opts,
	}
	if pb.annotations == nil {
		pb.annotations = map[string]string{}
	}
	maps.Copy(pb.annotations, spec.PauseAnnotations)
	if spec.HostNetwork {
		pb.netns = ""
	}
	return pb.write(sb.rec.Bundle)
}

// shimLogFIFO is the FIFO in the bundle a containerd shim writes its log (and its
// stderr) to; it refuses to start without one, and blocks logging until it is read.
const shimLogFIFO = "log"

// openShimLog makes (when create) the shim log FIFO of a task-only shim's pod and
// copies what the shim writes into criserver's log, one record per line. The copy
// ends when the shim exits or closeShimLog closes the FIFO.
func (c *Controller) openShimLog(sb *sandbox, create bool) error {
	path := filepath.Join(sb.rec.Bundle, shimLogFIFO)
	if create {
		if err := unix.Mkfifo(path, 0o600); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make shim log FIFO: %w", err)
		}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open shim log FIFO: %w", err)
	}
	sb.mu.Lock()
	sb.shimLog = f
	sb.mu.Unlock()
	w := &lineLogger{log: c.log.With("pod", sb.rec.ID, "shim", filepath.Base(sb.rec.Shim))}
	go func() {
		_ = fifoio.CopyFIFOIn(w, f)
		w.flush()
	}()
	return nil
}

// resumeShimLog reads a task-only shim's log FIFO again after a restart, before
// anything is asked of the shim: containerd's shims block in their logger, and with
// it in every call, while nobody reads it.
func (c *Controller) resumeShimLog(sb *sandbox) {
	if !sb.isTaskOnly() {
		return
	}
	if _, err := os.Stat(filepath.Join(sb.rec.Bundle, shimLogFIFO)); err != nil {
		return // the shim was never started
	}
	if err := c.openShimLog(sb, false); err != nil {
		c.log.Warn("shim log of pod not copied", "pod", sb.rec.ID, "err", err)
	}
}

// closeShimLog stops the copy of the shim's log.
func (sb *sandbox) closeShimLog() {
	sb.mu.Lock()
	f := sb.shimLog
	sb.shimLog = nil
	sb.mu.Unlock()
	if f != nil {
		_ = f.Close()
	}
}

// maxShimLogLine bounds a line of a shim's log kept in memory before it is logged.
const maxShimLogLine = 8 << 10

// lineLogger logs each line written to it.
type lineLogger struct {
	log     *slog.Logger
	pending []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.pending = append(l.pending, p...)
	for {
		i := bytes.IndexByte(l.pending, '\n')
		if i < 0 {
			break
		}
		l.emit(l.pending[:i])
		l.pending = l.pending[i+1:]
	}
	if len(l.pending) > maxShimLogLine {
		l.flush()
	}
	if len(l.pending) == 0 {
		l.pending = nil
	}
	return len(p), nil
}

func (l *lineLogger) flush() {
	if len(l.pending) > 0 {
		l.emit(l.pending)
	}
	l.pending = nil
}

func (l *lineLogger) emit(line []byte) {
	if s := strings.TrimSpace(string(line)); s != "" {
		l.log.Info("shim log", "line", s)
	}
}
