package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"

	options "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/internal/network"
	"github.com/crisp-runtime/crisp/internal/network/netns"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/tasksandbox"
)

const bucket = "sandboxes"

// Phases of a sandbox record. A record is written as "creating" before anything
// exists so that a crash half-way through Create can be undone on the next start.
const (
	phaseCreating = "creating"
	phaseReady    = "ready"
	phaseStopped  = "stopped"
)

// State is a sandbox's readiness as the CRI sees it.
type State int

// Sandbox states.
const (
	StateNotReady State = iota
	StateReady
)

// Options configures a Controller.
type Options struct {
	StateDir         string
	Runtimes         map[string]config.Runtime
	ShimStartTimeout time.Duration
	SystemdCgroup    bool
	// Address is criserver's own address, handed to shims as -address.
	Address string
	// Metrics records pod start phases, dead shims and recoveries; nil records nothing.
	Metrics *metrics.Metrics
	// PauseBinary is the static binary mounted as the pause container of pods on
	// task-only shims; empty finds shim-runc next to criserver or on PATH.
	PauseBinary string
	// ShimInterceptor, when set, runs on every ttrpc call to a shim: tracing's client
	// span and trace context (internal/tracing/export).
	ShimInterceptor ttrpc.UnaryClientInterceptor
	// TaskShimEnv is added to the environment of task-only shims: tracing's OTEL_*
	// variables, which containerd's shims built with tracing export their spans by.
	TaskShimEnv []string
}

// Spec is what the controller needs to run a pod.
type Spec struct {
	ID           string
	Handler      string
	Name         string
	Namespace    string
	UID          string
	HostNetwork  bool
	Sandbox      *options.SandboxOptions
	PortMappings []network.PortMapping
	Annotations  map[string]string
	CgroupParent string
	// PauseCgroupsPath is the OCI cgroupsPath of the pod's pause container, used when
	// a task-only shim runs the pod.
	PauseCgroupsPath string
	// PauseAnnotations are added to the pause container's when a task-only shim runs
	// the pod (containerd's: log directory, runtime handler, pod resources).
	PauseAnnotations map[string]string
}

// Status is a sandbox as the controller knows it.
type Status struct {
	ID            string
	State         State
	IP            string
	AdditionalIPs []string
	Pid           uint32
	ShimPid       int
	Address       string
	NetNS         string
	// Namespace is the containerd namespace the pod's shim was started in.
	Namespace string
	CreatedAt time.Time
	ExitedAt  time.Time
	ShimAlive bool
}

// record is the persisted part of a sandbox.
type record struct {
	ID            string      `json:"id"`
	Phase         string      `json:"phase"`
	Handler       string      `json:"handler"`
	Shim          string      `json:"shim"`
	Namespace     string      `json:"namespace"`
	Bundle        string      `json:"bundle"`
	Address       string      `json:"address,omitempty"`
	NetNS         string      `json:"netns,omitempty"`
	HostNetwork   bool        `json:"host_network"`
	Pod           network.Pod `json:"pod"`
	IP            string      `json:"ip,omitempty"`
	AdditionalIPs []string    `json:"additional_ips,omitempty"`
	Pid           uint32      `json:"pid,omitempty"`
	CreatedAt     time.Time   `json:"created_at"`
	ExitedAt      time.Time   `json:"exited_at,omitzero"`
	NetworkDone   bool        `json:"network_done"`
	// Mode is the handler's sandbox_mode when the pod was made ("" in records of
	// older versions: sandbox), and
	// TaskAPI the task API version its shim's start answered (2 or 3).
	Mode        string        `json:"mode,omitempty"`
	TaskAPI     int           `json:"task_api,omitempty"`
	StopTimeout time.Duration `json:"-"`
}

// sandbox is a live sandbox: its record plus the connection to its shim.
type sandbox struct {
	// op serialises lifecycle operations (stop, remove, reaping a dead shim's pod) on
	// one sandbox.
	op sync.Mutex

	mu       sync.Mutex
	rec      record
	client   *ttrpc.Client
	svc      sandboxapi.TTRPCSandboxService
	shimDead bool
	exited   bool
	shimPid  int
	cancel   context.CancelFunc
	// watching is set by the first watch call: one pause watcher per sandbox.
	watching bool
	// Reaping a dead shim's pod (see reap.go): reaping is set when the reaper was
	// started, cleaned once a `shim delete` killed what the pod ran, and reaped is
	// closed by the reaper alone when it is done, with reapErr why it failed.
	reaping  bool
	cleaned  bool
	reaped   chan struct{}
	reapErr  error
	reapedAt time.Time
	// shimLog is criserver's copy of a task-only shim's log.
	shimLog *tasksandbox.ShimLog
}

func newSandbox(rec record) *sandbox {
	return &sandbox{rec: rec, reaped: make(chan struct{})}
}

// Controller runs pods in shims. It is safe for concurrent use.
type Controller struct {
	opts  Options
	store *store.Store
	net   *network.Manager
	log   *slog.Logger
	// bg bounds the controller's own background work (reaping dead shims); Close
	// cancels it.
	bg     context.Context
	stopBG context.CancelFunc

	// spares are the warm spare shims (see spare.go).
	spares *spareSet
	// tasks is the task-only sandboxer: the sandbox of a pod whose handler's
	// sandbox_mode is task (the other sandboxer is crisp's shim, reached over ttrpc).
	tasks *tasksandbox.Sandboxer
	// legacyStart holds the task-only handlers whose shims take the legacy start
	// protocol (startShimProcess found out).
	legacyStart sync.Map
	// events receives task-only shims' events (tasksandbox's ServeEvents); nil
	// without such handlers.
	events *ttrpc.Server

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	// exits carries the ids of sandboxes whose pause process exited (see SandboxExits).
	exits chan string
}

// sandboxExitBuffer bounds the exits nobody has read yet; beyond it they are dropped
// (and logged): they only feed events, and the pod's state is right either way.
const sandboxExitBuffer = 256

// SandboxExits delivers the id of every sandbox whose pause process exited, whether it
// was stopped or died on its own, so that the CRI can tell event subscribers at once.
func (c *Controller) SandboxExits() <-chan string { return c.exits }

// New returns a controller; call Recover before serving to find running shims again.
func New(opts Options, st *store.Store, net *network.Manager, log *slog.Logger) (*Controller, error) {
	for _, dir := range []string{opts.bundleRoot(), opts.socketDir()} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	tasks, err := tasksandbox.New(tasksandbox.Config{
		Runtimes: opts.Runtimes, StateDir: opts.StateDir, SystemdCgroup: opts.SystemdCgroup,
		ContainerDir: opts.containerDir(), Address: opts.Address, SocketDir: opts.socketDir(), Log: log,
	})
	if err != nil {
		return nil, err
	}
	for name, rt := range opts.Runtimes {
		if rt.Mode() != config.SandboxModeTask {
			continue
		}
		if opts.PauseBinary == "" {
			p, err := ResolveShim("shim-runc")
			if err != nil {
				return nil, fmt.Errorf("runtimes.%s: the pause container of a task-only shim runs crisp's shim-runc: %w", name, err)
			}
			opts.PauseBinary = p
		}
	}
	bg, stop := context.WithCancel(context.Background())
	c := &Controller{opts: opts, store: st, net: net, log: log, bg: bg, stopBG: stop, sandboxes: map[string]*sandbox{},
		exits: make(chan string, sandboxExitBuffer), spares: newSpareSet(opts.Runtimes), tasks: tasks}
	if tasks.Handlers() > 0 {
		if c.events, err = tasks.ServeEvents(bg, opts.eventsSocket()); err != nil {
			stop()
			return nil, err
		}
	}
	opts.Metrics.WatchShims(c.liveShims)
	return c, nil
}

// liveShims counts the shims the controller is connected to and has not found dead.
func (c *Controller) liveShims() int {
	c.mu.Lock()
	sbs := make([]*sandbox, 0, len(c.sandboxes))
	for _, sb := range c.sandboxes {
		sbs = append(sbs, sb)
	}
	c.mu.Unlock()
	n := 0
	for _, sb := range sbs {
		sb.mu.Lock()
		if sb.client != nil && !sb.shimDead {
			n++
		}
		sb.mu.Unlock()
	}
	return n
}

func (o Options) bundleRoot() string { return filepath.Join(o.StateDir, "sandboxes") }
func (o Options) socketDir() string  { return filepath.Join(o.StateDir, "s") }
func (o Options) netnsDir() string   { return filepath.Join(o.StateDir, "netns") }

// eventsSocket is the ttrpc address task-only shims publish their task events to.
func (o Options) eventsSocket() string { return filepath.Join(o.StateDir, "events.sock") }

// HasHandler reports whether a runtime handler is configured.
func (c *Controller) HasHandler(name string) bool {
	_, ok := c.opts.Runtimes[name]
	return ok
}

func (c *Controller) call(rec *record) shimCall {
	call := shimCall{
		binary:    rec.Shim,
		namespace: rec.Namespace,
		address:   c.opts.Address,
		id:        rec.ID,
		bundle:    rec.Bundle,
		socketDir: c.opts.socketDir(),
	}
	if rec.Mode == config.SandboxModeTask {
		call.events = c.opts.eventsSocket()
		call.env = c.opts.TaskShimEnv
		call.options = c.tasks.Options(rec.Handler)
		_, call.legacy = c.legacyStart.Load(rec.Handler)
	}
	return call
}

// startShimProcess runs the shim's start. A task-only shim that refuses the
// bootstrap protocol (containerd 1.x shims read stdin as runtime options) is started
// again the legacy way, which its handler then keeps using; its answer is kept in the
// bundle (bootstrap.json) for recovery.
func (c *Controller) startShimProcess(ctx context.Context, rec *record) (string, int, error) {
	call := c.call(rec)
	addr, version, err := call.start(ctx)
	if err != nil && rec.Mode == config.SandboxModeTask && !call.legacy {
		call.legacy = true
		var lerr error
		if addr, version, lerr = call.start(ctx); lerr != nil {
			return "", 0, fmt.Errorf("%w; started the legacy way: %w", err, lerr)
		}
		err = nil
		c.legacyStart.Store(rec.Handler, true)
		c.log.Info("task-only shim takes the legacy start protocol", "handler", rec.Handler, "shim", rec.Shim)
	}
	if err != nil || rec.Mode != config.SandboxModeTask {
		return addr, version, err
	}
	if err := tasksandbox.WriteBootstrap(rec.Bundle, addr, version); err != nil {
		return "", 0, fmt.Errorf("record the address of shim %s: %w", rec.ID, err)
	}
	return addr, version, nil
}

// connect dials the shim of sb and records its pid. Here the controller chooses the
// pod's sandboxer by its handler's mode: crisp's shim serves the sandbox API itself; a
// task-only shim's sandbox API is tasksandbox's, on top of the shim's task API.
func (c *Controller) connect(ctx context.Context, sb *sandbox) error {
	var chain []ttrpc.UnaryClientInterceptor
	if c.opts.ShimInterceptor != nil {
		chain = append(chain, c.opts.ShimInterceptor)
	}
	if sb.rec.TaskAPI == 2 {
		// Innermost: the span is named for the call crisp makes (task v3).
		chain = append(chain, tasksandbox.TaskV2)
	}
	var copts []ttrpc.ClientOpts
	if len(chain) > 0 {
		copts = append(copts, ttrpc.WithChainUnaryClientInterceptor(chain...))
	}
	client, err := dialShim(ctx, sb.rec.Address, copts, func() {
		sb.mu.Lock()
		// Close and teardown drop the client first: a close with it still set is
		// the shim going away on its own.
		if sb.client != nil {
			c.markShimDeadLocked(sb, "connection to the shim closed")
		}
		sb.mu.Unlock()
	})
	if err != nil {
		return err
	}
	sb.mu.Lock()
	sb.client = client
	sb.svc = sandboxapi.NewTTRPCSandboxClient(client)
	if sb.isTaskOnly() {
		tc := taskapi.NewTTRPCTaskClient(client)
		sb.svc = c.tasks.Sandbox(tc, sb.rec.Handler, sb.rec.CreatedAt, taskVersion(sb.rec.TaskAPI))
		if sb.shimPid == 0 {
			sb.shimPid = tasksandbox.ShimPid(ctx, tc, sb.rec.ID, sb.rec.Bundle)
		}
	}
	sb.shimDead = false
	sb.shimPid = readShimPid(sb.rec.Bundle)
	sb.mu.Unlock()
	return nil
}

// watch waits in the background for the pause process to exit, so that status and
// lists never have to ask the shim.
func (c *Controller) watch(sb *sandbox) {
	sb.mu.Lock()
	if sb.watching || sb.svc == nil {
		sb.mu.Unlock()
		return
	}
	sb.watching = true
	ctx, cancel := context.WithCancel(context.Background())
	sb.cancel = cancel
	svc := sb.svc
	id := sb.rec.ID
	sb.mu.Unlock()
	go func() {
		resp, err := svc.WaitSandbox(ctx, &sandboxapi.WaitSandboxRequest{SandboxID: id})
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.log.Warn("lost connection to pod shim", "pod", id, "err", err)
			c.markShimDeadLocked(sb, "waiting for the pause process failed: "+err.Error())
			return
		}
		sb.exited = true
		if t := resp.GetExitedAt(); t != nil {
			sb.rec.ExitedAt = t.AsTime()
		}
		c.log.Info("pod sandbox exited", "pod", id, "exit_status", resp.GetExitStatus())
		select {
		case c.exits <- id:
		default:
			c.log.Warn("sandbox exit not delivered: nobody reads exits", "pod", id)
		}
	}()
}

// Stop stops the pod's sandbox and frees its network. It succeeds for an unknown or
// already stopped pod.
func (c *Controller) Stop(ctx context.Context, id string, timeout time.Duration) error {
	sb := c.get(id)
	if sb == nil {
		return nil
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	return c.stop(ctx, sb, timeout)
}

func (c *Controller) stop(ctx context.Context, sb *sandbox, timeout time.Duration) error {
	sb.mu.Lock()
	phase, svc, dead := sb.rec.Phase, sb.svc, sb.shimDead
	sb.mu.Unlock()
	if phase == phaseStopped {
		return nil
	}
	// The pause process and the network go down at once: CNI DEL works on the pinned
	// namespace whether or not the pause process still runs in it.
	netErr := make(chan error, 1)
	go func() { netErr <- c.teardownNetwork(ctx, sb) }()
	err := c.stopSandboxProcess(ctx, sb, svc, dead, timeout)
	if nerr := <-netErr; nerr != nil {
		err = errors.Join(err, nerr)
	}
	if err != nil {
		return err
	}
	sb.mu.Lock()
	sb.rec.Phase = phaseStopped
	sb.exited = true
	if sb.rec.ExitedAt.IsZero() {
		sb.rec.ExitedAt = time.Now()
	}
	rec := sb.rec
	sb.mu.Unlock()
	return c.store.Put(bucket, rec.ID, rec)
}

// stopSandboxProcess stops the pause process through the shim, or cleans up after a
// shim that is gone.
func (c *Controller) stopSandboxProcess(ctx context.Context, sb *sandbox, svc sandboxapi.TTRPCSandboxService, dead bool, timeout time.Duration) error {
	if svc != nil && !dead {
		_, err := svc.StopSandbox(ctx, &sandboxapi.StopSandboxRequest{SandboxID: sb.rec.ID, TimeoutSecs: uint32(timeout / time.Second)})
		if err != nil && !errdefs.IsNotFound(fromShim(err)) {
			if !c.isShimGone(sb) {
				return fmt.Errorf("stop sandbox %s: %w", sb.rec.ID, fromShim(err))
			}
			dead = true
		}
	} else {
		dead = true
	}
	if dead {
		return c.cleanDeadShim(ctx, sb)
	}
	return nil
}

// teardownNetwork runs CNI DEL and removes the pod's netns. A failed DEL is an error
// (kept for the caller's retry) until the network manager gives up on it and retries
// it in the background (see internal/network/pending.go); undoing a creation, at once, since a
// pod kubelet never learned of is never stopped again.
func (c *Controller) teardownNetwork(ctx context.Context, sb *sandbox) error {
	if sb.rec.HostNetwork {
		return nil
	}
	if sb.rec.NetNS != "" || sb.rec.NetworkDone {
		sb.mu.Lock()
		creating := sb.rec.Phase == phaseCreating
		sb.mu.Unlock()
		teardown := c.net.Teardown
		if creating {
			teardown = c.net.Release
		}
		if err := teardown(ctx, sb.rec.Pod); err != nil {
			return fmt.Errorf("tear down network of pod %s: %w", sb.rec.ID, err)
		}
	}
	if sb.rec.NetNS != "" {
		if err := netns.Remove(sb.rec.NetNS); err != nil {
			return fmt.Errorf("remove network namespace of pod %s: %w", sb.rec.ID, err)
		}
	}
	return nil
}

// isShimGone reports whether the shim process of sb has exited.
func (c *Controller) isShimGone(sb *sandbox) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.shimDead {
		return true
	}
	if sb.shimPid > 0 && !processAlive(sb.shimPid) {
		c.markShimDeadLocked(sb, "the shim process exited")
	}
	return sb.shimDead
}

// Remove stops the pod if needed, shuts its shim down and deletes every trace of it.
// It succeeds for an unknown pod.
func (c *Controller) Remove(ctx context.Context, id string) error {
	sb := c.get(id)
	if sb == nil {
		return nil
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if err := c.teardown(ctx, sb, 0, false); err != nil {
		return err
	}
	c.forget(id)
	return nil
}

// teardown undoes everything of sb in reverse order of Create. force skips the
// graceful stop (used when undoing a failed Create).
func (c *Controller) teardown(ctx context.Context, sb *sandbox, timeout time.Duration, force bool) error {
	if err := c.stop(ctx, sb, timeout); err != nil && !force {
		return err
	} else if err != nil {
		c.log.Warn("stop during cleanup", "pod", sb.rec.ID, "err", err)
		// Make sure the pause and the network are gone even so.
		if derr := c.deleteWithShim(ctx, sb); derr != nil {
			return errors.Join(err, derr)
		}
		if nerr := c.teardownNetwork(ctx, sb); nerr != nil {
			return errors.Join(err, nerr)
		}
	}
	// The shim: ask it to exit, and make sure it did.
	sb.mu.Lock()
	client, svc, dead, pid, cancel := sb.client, sb.svc, sb.shimDead, sb.shimPid, sb.cancel
	sb.client = nil
	sb.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if pid == 0 {
		pid = readShimPid(sb.rec.Bundle)
	}
	if pid == 0 {
		// A shim start killed (the caller's cancel, or criserver's death) after it
		// forked the serving shim and before it recorded it.
		pid = findShim(sb.rec.Bundle, sb.rec.ID)
	}
	if !isShimOf(pid, sb.rec.ID) {
		// Never signal a pid the kernel may have handed to someone else.
		pid = 0
	}
	if svc != nil && !dead {
		if _, err := svc.ShutdownSandbox(ctx, &sandboxapi.ShutdownSandboxRequest{SandboxID: sb.rec.ID}); err != nil && !errors.Is(err, ttrpc.ErrClosed) {
			c.log.Debug("shutdown sandbox", "pod", sb.rec.ID, "err", err)
		}
	}
	if client != nil {
		// The shim is being torn down: a close error says nothing the caller can act on.
		_ = client.Close()
	}
	defer sb.closeShimLog()
	if pid > 0 && (svc == nil || dead) && processAlive(pid) {
		// Nobody could ask it to exit: a shim that does not answer serves no one.
		c.log.Warn("shim unreachable; killing it", "pod", sb.rec.ID, "pid", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if pid > 0 && !waitGone(pid, 5*time.Second) {
		c.log.Warn("shim did not exit after shutdown; killing it", "pod", sb.rec.ID, "pid", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 2*time.Second)
	}
	if sb.rec.Address != "" {
		_ = os.Remove(trimUnix(sb.rec.Address))
	} else if sb.isTaskOnly() {
		c.tasks.RemoveShimSockets(c.taskPod(sb))
	}
	if err := os.RemoveAll(sb.rec.Bundle); err != nil {
		return fmt.Errorf("remove bundle of pod %s: %w", sb.rec.ID, err)
	}
	return c.store.Delete(bucket, sb.rec.ID)
}

// Status returns what the controller knows of a sandbox; errdefs.ErrNotFound if none.
func (c *Controller) Status(id string) (*Status, error) {
	sb := c.get(id)
	if sb == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return sb.status(), nil
}

// Ready reports whether the sandbox is known and ready, without copying its status.
func (c *Controller) Ready(id string) bool {
	sb := c.get(id)
	if sb == nil {
		return false
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.ready()
}

// sandboxClient returns the sandbox API client of the pod's live shim: NotFound for an
// unknown pod, Unavailable when its shim is not running.
func (c *Controller) sandboxClient(id string) (sandboxapi.TTRPCSandboxService, error) {
	sb := c.get(id)
	if sb == nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	sb.mu.Lock()
	svc, dead := sb.svc, sb.shimDead
	sb.mu.Unlock()
	if svc == nil || dead {
		return nil, fmt.Errorf("the shim of pod %s is not running: %w", id, errdefs.ErrUnavailable)
	}
	return svc, nil
}

// Info asks the shim for its verbose view of the sandbox.
func (c *Controller) Info(ctx context.Context, id string) (map[string]string, error) {
	svc, err := c.sandboxClient(id)
	if err != nil {
		return nil, err
	}
	resp, err := svc.SandboxStatus(ctx, &sandboxapi.SandboxStatusRequest{SandboxID: id, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("sandbox status from shim: %w", fromShim(err))
	}
	info := resp.GetInfo()
	if info == nil {
		info = map[string]string{}
	}
	info["shim_state"] = resp.GetState()
	return info, nil
}

func (sb *sandbox) status() *Status {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	st := &Status{
		ID:            sb.rec.ID,
		IP:            sb.rec.IP,
		AdditionalIPs: append([]string(nil), sb.rec.AdditionalIPs...),
		Pid:           sb.rec.Pid,
		ShimPid:       sb.shimPid,
		Address:       sb.rec.Address,
		NetNS:         sb.rec.NetNS,
		Namespace:     sb.rec.Namespace,
		CreatedAt:     sb.rec.CreatedAt,
		ExitedAt:      sb.rec.ExitedAt,
		ShimAlive:     sb.client != nil && !sb.shimDead,
	}
	if sb.ready() {
		st.State = StateReady
	}
	return st
}

// ready is the sandbox's readiness; sb.mu must be held.
func (sb *sandbox) ready() bool {
	return sb.rec.Phase == phaseReady && !sb.shimDead && !sb.exited
}

func (c *Controller) get(id string) *sandbox {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sandboxes[id]
}

func (c *Controller) forget(id string) {
	c.mu.Lock()
	delete(c.sandboxes, id)
	c.mu.Unlock()
}

// Close shuts the warm spare shims down and drops the connections to every other
// shim; the pods' shims and their pods keep running.
func (c *Controller) Close() {
	c.stopBG()
	if c.events != nil {
		_ = c.events.Close()
	}
	c.closeSpares()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sb := range c.sandboxes {
		sb.mu.Lock()
		if sb.cancel != nil {
			sb.cancel()
		}
		if sb.client != nil {
			client := sb.client
			sb.client = nil
			_ = client.Close() // the connection is being dropped; nothing to do on error

		}
		sb.mu.Unlock()
	}
}

func trimUnix(addr string) string {
	const p = "unix://"
	if len(addr) > len(p) && addr[:len(p)] == p {
		return addr[len(p):]
	}
	return addr
}
