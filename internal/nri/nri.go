package nri

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	validator "github.com/containerd/nri/plugins/default-validator"
	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/tracing"
	"github.com/crisp-runtime/crisp/internal/version"
)

// Runtime is what NRI needs of the CRI service: its pods and containers for a plugin
// that connects (Synchronize), and the paths of UpdateContainerResources and
// StopContainer for the updates and evictions plugins ask for.
type Runtime interface {
	// Pods lists every pod that has not been removed.
	Pods() []Pod
	// Containers lists every container that has not exited.
	Containers() []Container
	// UpdateContainer changes a container's resources as UpdateContainerResources does.
	UpdateContainer(ctx context.Context, id string, r *api.LinuxResources) error
	// EvictContainer stops a container as StopContainer with no grace period does.
	EvictContainer(ctx context.Context, id, reason string) error
}

// NRI is the Node Resource Interface of criserver: the NRI library's adaptation fed
// with crisp's pod and container events. A nil *NRI is NRI turned off: every method
// is then a no-op that returns no adjustment and no error.
type NRI struct {
	a   *adaptation.Adaptation
	log *slog.Logger
	cdi func(*rspec.Spec, []string) error

	mu sync.Mutex
	rt Runtime
	// state is what each container was last reported to plugins as, so that each
	// container gets one StopContainer and one RemoveContainer (stops come from
	// StopContainer, an exit, StopPodSandbox and RemoveContainer), as containerd does.
	state map[string]state
	// stopping holds, for each container whose StopContainer is being delivered, a
	// channel closed once plugins have answered it: a later event of the container
	// (RemoveContainer, or StopPodSandbox of its pod) waits for it, so plugins see
	// the stop first even when an exit sends it in the background.
	stopping map[string]chan struct{}
	// stopped is set by Stop: no background delivery starts after it.
	stopped bool

	// exits are the background deliveries of exits (NotifyContainerExit), under bg:
	// Stop cancels bg and waits for them.
	exits    sync.WaitGroup
	bg       context.Context
	cancelBG context.CancelFunc

	// hookMu is held around each call into the library, cur is the traced hook under
	// way, if any: the library reports each plugin's answer with no context (trace.go).
	hookMu sync.Mutex
	cur    atomic.Pointer[pluginSpans]
}

type state int

const (
	stateNone state = iota
	stateCreated
	stateRunning
	stateStopped
)

// New returns criserver's NRI for cfg, not started; nil when cfg turns NRI off. cdi
// injects the CDI devices plugins ask for (nil: such an adjustment fails the create).
func New(cfg config.NRIConfig, log *slog.Logger, cdi func(*rspec.Spec, []string) error) (*NRI, error) {
	if cfg.Disable {
		return nil, nil
	}
	n := &NRI{log: log, cdi: cdi, state: map[string]state{}, stopping: map[string]chan struct{}{}}
	n.bg, n.cancelBG = context.WithCancel(context.Background())
	// The library keeps its timeouts and logger in package variables: one NRI per
	// process, as in containerd. Its logger is set once, unsynchronized as its setter
	// is, before any of its goroutines can read it.
	adaptation.SetPluginRegistrationTimeout(time.Duration(cfg.PluginRegistrationTimeout))
	adaptation.SetPluginRequestTimeout(time.Duration(cfg.PluginRequestTimeout))
	setLibraryLogger.Do(func() { nrilog.Set(slogAdapter{log}) })
	opts := []adaptation.Option{
		adaptation.WithPluginPath(cfg.PluginPath),
		adaptation.WithPluginConfigPath(cfg.PluginConfigPath),
		// Tracing: a span per plugin answer, and the trace context to plugins.
		adaptation.WithMetrics(pluginReports{n}),
		ttrpcOptions(),
	}
	if cfg.DisableConnections {
		opts = append(opts, adaptation.WithDisabledExternalConnections())
	} else {
		opts = append(opts, adaptation.WithSocketPath(cfg.SocketPath))
	}
	if v := cfg.DefaultValidator; v.Enable {
		// The library's own validator, as containerd 2.4 configures it: a built-in
		// plugin that sees the merged adjustment of every CreateContainer and fails
		// the create when it refuses it.
		opts = append(opts, adaptation.WithDefaultValidator(&validator.DefaultValidatorConfig{
			Enable:                                true,
			RejectOCIHookAdjustment:               v.RejectOCIHookAdjustment,
			RejectRuntimeDefaultSeccompAdjustment: v.RejectRuntimeDefaultSeccompAdjustment,
			RejectUnconfinedSeccompAdjustment:     v.RejectUnconfinedSeccompAdjustment,
			RejectCustomSeccompAdjustment:         v.RejectCustomSeccompAdjustment,
			RejectNamespaceAdjustment:             v.RejectNamespaceAdjustment,
			RejectSysctlAdjustment:                v.RejectSysctlAdjustment,
			RequiredPlugins:                       slices.Clone(v.RequiredPlugins),
			TolerateMissingAnnotation:             v.TolerateMissingAnnotation,
		}))
	}
	a, err := adaptation.New("crisp", version.Version, n.synchronize, n.updateFromPlugin, opts...)
	if err != nil {
		return nil, fmt.Errorf("nri: %w", err)
	}
	n.a = a
	return n, nil
}

// Start starts the pre-registered plugins of plugin_path and listens on socket_path.
// rt must be able to list the recovered pods and containers: a plugin synchronizes
// with them as soon as it registers.
func (n *NRI) Start(rt Runtime) error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	n.rt = rt
	n.mu.Unlock()
	if err := n.a.Start(); err != nil {
		n.a.Stop()
		return fmt.Errorf("start NRI: %w", err)
	}
	n.log.Info("NRI started")
	return nil
}

// Stop disconnects the plugins (pre-registered ones are stopped), removes the socket
// and waits for the exits still being delivered, which it cancels.
func (n *NRI) Stop() {
	if n == nil {
		return
	}
	n.mu.Lock()
	n.stopped = true
	n.mu.Unlock()
	n.cancelBG()
	n.a.Stop()
	n.exits.Wait()
}

// Enabled reports whether NRI is on.
func (n *NRI) Enabled() bool { return n != nil }

// SyncBlock keeps plugins from synchronizing until its Unblock: a pod or container
// being created is in neither the list a plugin synchronizes with nor, yet, the
// events it has seen. Unblock is nil-safe.
type SyncBlock = adaptation.PluginSyncBlock

// BlockSync returns a SyncBlock; call Unblock once the pod or container is listed.
func (n *NRI) BlockSync() *SyncBlock {
	if n == nil {
		return nil
	}
	return n.a.BlockPluginSync()
}

// RunPodSandbox tells plugins a pod is up. An error fails RunPodSandbox, as in containerd.
func (n *NRI) RunPodSandbox(ctx context.Context, p Pod) error {
	if n == nil {
		return nil
	}
	return n.hook(ctx, api.Event_RUN_POD_SANDBOX, &p, nil, func(ctx context.Context) error {
		return n.a.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: p.toNRI()})
	})
}

// UpdatePodSandbox tells plugins a pod's resources are changing; an error fails the update.
func (n *NRI) UpdatePodSandbox(ctx context.Context, p Pod) error {
	if n == nil {
		return nil
	}
	np := p.toNRI()
	return n.hook(ctx, api.Event_UPDATE_POD_SANDBOX, &p, nil, func(ctx context.Context) error {
		_, err := n.a.UpdatePodSandbox(ctx, &api.UpdatePodSandboxRequest{Pod: np, OverheadLinuxResources: np.GetLinux().GetPodOverhead(), LinuxResources: np.GetLinux().GetPodResources()})
		return err
	})
}

// PostUpdatePodSandbox tells plugins a pod's resources changed.
func (n *NRI) PostUpdatePodSandbox(ctx context.Context, p Pod) {
	if n == nil {
		return
	}
	n.notify(ctx, "PostUpdatePodSandbox", n.hook(ctx, api.Event_POST_UPDATE_POD_SANDBOX, &p, nil, func(ctx context.Context) error {
		return n.a.PostUpdatePodSandbox(ctx, &api.PostUpdatePodSandboxRequest{Pod: p.toNRI()})
	}))
}

// StopPodSandbox tells plugins a pod stopped; errors are logged, as containerd does.
func (n *NRI) StopPodSandbox(ctx context.Context, p Pod) {
	if n == nil {
		return
	}
	n.notify(ctx, "StopPodSandbox", n.hook(ctx, api.Event_STOP_POD_SANDBOX, &p, nil, func(ctx context.Context) error {
		return n.a.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: p.toNRI()})
	}))
}

// RemovePodSandbox tells plugins a pod is gone; errors are logged.
func (n *NRI) RemovePodSandbox(ctx context.Context, p Pod) {
	if n == nil {
		return
	}
	n.notify(ctx, "RemovePodSandbox", n.hook(ctx, api.Event_REMOVE_POD_SANDBOX, &p, nil, func(ctx context.Context) error {
		return n.a.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: p.toNRI()})
	}))
}

// CreateContainer asks plugins for their adjustments of a container about to be
// created and applies them to c.Spec, which must be the spec the container will run
// with. A plugin's error, conflicting adjustments or an adjustment that cannot be
// applied fail the create, as in containerd; a plugin that times out or crashes is
// disconnected by the library and the create goes on without it. The updates and
// evictions plugins ask for along with it are applied to other containers, failures
// only logged.
func (n *NRI) CreateContainer(ctx context.Context, p Pod, c Container) (_ *api.ContainerAdjustment, err error) {
	if n == nil {
		return nil, nil
	}
	if c.Spec == nil {
		return nil, errors.New("nri: CreateContainer without the container's spec")
	}
	ctx, span := startHook(ctx, api.Event_CREATE_CONTAINER, &p, &c)
	defer tracing.Finish(span, &err)
	var rsp *api.CreateContainerResponse
	err = n.call(ctx, api.Event_CREATE_CONTAINER, func(ctx context.Context) error {
		var err error
		rsp, err = n.a.CreateContainer(ctx, &api.CreateContainerRequest{Pod: p.toNRI(), Container: c.toNRI()})
		return err
	})
	n.setState(c.ID, stateCreated)
	if span.IsRecording() {
		span.SetAttributes(attrRejected.Bool(err != nil && refusedByValidator(err)), attrAdjustments.Int(countAdjustments(rsp.GetAdjust())),
			attrUpdates.Int(len(rsp.GetUpdate())), attrEvictions.Int(len(rsp.GetEvict())))
	}
	if err != nil {
		if refusedByValidator(err) {
			return nil, fmt.Errorf("NRI CreateContainer: %w (a node policy: [nri.default_validator] or a validating plugin): %w", err, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("NRI CreateContainer: %w", err)
	}
	n.evict(ctx, "create", rsp.GetEvict())
	n.update(ctx, "create", rsp.GetUpdate())
	if err := n.AdjustSpec(c.Spec, rsp.GetAdjust()); err != nil {
		return nil, fmt.Errorf("apply NRI adjustment to container %s: %w", c.ID, err)
	}
	return rsp.GetAdjust(), nil
}

// refusedByValidator reports whether a CreateContainer error is a validator's refusal
// of the plugins' adjustment: a node policy, so FailedPrecondition rather than an
// unknown failure. The library keeps only the text of it (pkg/api/validate.go).
func refusedByValidator(err error) bool {
	return strings.Contains(err.Error(), "rejected container adjustment")
}

// AdjustSpec applies an NRI adjustment to an OCI spec with the library's generator,
// as containerd applies it.
func (n *NRI) AdjustSpec(s *rspec.Spec, adj *api.ContainerAdjustment) error {
	if adj == nil {
		return nil
	}
	cdi := n.cdi
	if cdi == nil {
		cdi = func(_ *rspec.Spec, devices []string) error {
			return fmt.Errorf("CDI devices %v asked for but CDI is off", devices)
		}
	}
	return adjustSpec(s, adj, cdi)
}

// UndoCreateContainer tells plugins a container whose create they saw failed.
func (n *NRI) UndoCreateContainer(ctx context.Context, p Pod, c Container) {
	if n == nil || n.getState(c.ID) == stateNone {
		return
	}
	n.StopContainer(ctx, p, c)
	n.RemoveContainer(ctx, p, c)
}

// PostCreateContainer tells plugins a container was created; errors are logged.
func (n *NRI) PostCreateContainer(ctx context.Context, p Pod, c Container) {
	if n == nil {
		return
	}
	n.notify(ctx, "PostCreateContainer", n.hook(ctx, api.Event_POST_CREATE_CONTAINER, &p, &c, func(ctx context.Context) error {
		return n.a.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: p.toNRI(), Container: c.toNRI()})
	}))
}

// StartContainer tells plugins a container is about to start; an error fails the start.
func (n *NRI) StartContainer(ctx context.Context, p Pod, c Container) error {
	if n == nil {
		return nil
	}
	err := n.hook(ctx, api.Event_START_CONTAINER, &p, &c, func(ctx context.Context) error {
		return n.a.StartContainer(ctx, &api.StartContainerRequest{Pod: p.toNRI(), Container: c.toNRI()})
	})
	n.setState(c.ID, stateRunning)
	if err != nil {
		return fmt.Errorf("NRI StartContainer: %w", err)
	}
	return nil
}

// PostStartContainer tells plugins a container started; errors are logged.
func (n *NRI) PostStartContainer(ctx context.Context, p Pod, c Container) {
	if n == nil {
		return
	}
	n.notify(ctx, "PostStartContainer", n.hook(ctx, api.Event_POST_START_CONTAINER, &p, &c, func(ctx context.Context) error {
		return n.a.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: p.toNRI(), Container: c.toNRI()})
	}))
}

// UpdateContainer asks plugins about a resource update of a container; req is the
// update asked for (NRI form). It returns the resources to apply instead (nil: req as
// is) or an error, which fails the update, as in containerd.
func (n *NRI) UpdateContainer(ctx context.Context, p Pod, c Container, req *api.LinuxResources) (_ *api.LinuxResources, err error) {
	if n == nil {
		return nil, nil
	}
	ctx, span := startHook(ctx, api.Event_UPDATE_CONTAINER, &p, &c)
	defer tracing.Finish(span, &err)
	var rsp *api.UpdateContainerResponse
	err = n.call(ctx, api.Event_UPDATE_CONTAINER, func(ctx context.Context) error {
		var err error
		rsp, err = n.a.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: p.toNRI(), Container: c.toNRI(), LinuxResources: req})
		return err
	})
	if span.IsRecording() {
		span.SetAttributes(attrUpdates.Int(len(rsp.GetUpdate())), attrEvictions.Int(len(rsp.GetEvict())))
	}
	if err != nil {
		return nil, fmt.Errorf("NRI UpdateContainer: %w", err)
	}
	n.evict(ctx, "update", rsp.GetEvict())
	// The library puts the update of the container itself last.
	ups := rsp.GetUpdate()
	if len(ups) == 0 {
		return nil, nil
	}
	n.update(ctx, "update", ups[:len(ups)-1])
	return ups[len(ups)-1].GetLinux().GetResources(), nil
}

// PostUpdateContainer tells plugins a container's resources changed; errors are logged.
func (n *NRI) PostUpdateContainer(ctx context.Context, p Pod, c Container) {
	if n == nil {
		return
	}
	n.notify(ctx, "PostUpdateContainer", n.hook(ctx, api.Event_POST_UPDATE_CONTAINER, &p, &c, func(ctx context.Context) error {
		return n.a.PostUpdateContainer(ctx, &api.PostUpdateContainerRequest{Pod: p.toNRI(), Container: c.toNRI()})
	}))
}

// StopContainer tells plugins a container stopped (once per container, however many
// paths report it); errors are logged, updates plugins ask for are applied. When
// another path is delivering the stop, it waits (within ctx) until plugins have it,
// so that whatever the caller sends next comes after it. The caller must hold no
// container's lock: the updates and evictions plugins answer with take them.
func (n *NRI) StopContainer(ctx context.Context, p Pod, c Container) {
	if n == nil {
		return
	}
	delivered, claimed := n.claimStop(c.ID)
	if !claimed {
		n.awaitStop(ctx, c.ID)
		return
	}
	n.deliverStop(ctx, p, c, delivered)
}

// NotifyContainerExit tells plugins, in the background, that a container ended on its
// own or was killed, as containerd's NotifyContainerExit does: the exit is recorded
// and published without waiting for plugins, or for the updates they answer with,
// which may wait for other containers' locks. The stop is claimed before it returns,
// so a later StopContainer or RemoveContainer of the container waits for it.
func (n *NRI) NotifyContainerExit(p Pod, c Container) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	delivered, claimed := n.claimStopLocked(c.ID)
	if !claimed {
		return
	}
	n.exits.Add(1)
	go func() {
		defer n.exits.Done()
		ctx, cancel := context.WithTimeout(n.bg, exitNotifyTimeout)
		defer cancel()
		n.deliverStop(ctx, p, c, delivered)
	}()
}

// exitNotifyTimeout bounds the background delivery of an exit and of the updates
// plugins answer it with.
const exitNotifyTimeout = 30 * time.Second

// deliverStop sends StopContainer, marks it delivered, then applies the updates
// plugins answered with: later events of the container need not wait for those.
func (n *NRI) deliverStop(ctx context.Context, p Pod, c Container, delivered func()) {
	ctx, span := startHook(ctx, api.Event_STOP_CONTAINER, &p, &c)
	var rsp *api.StopContainerResponse
	err := n.call(ctx, api.Event_STOP_CONTAINER, func(ctx context.Context) error {
		var err error
		rsp, err = n.a.StopContainer(ctx, &api.StopContainerRequest{Pod: p.toNRI(), Container: c.toNRI()})
		return err
	})
	delivered()
	if span.IsRecording() {
		span.SetAttributes(attrUpdates.Int(len(rsp.GetUpdate())))
	}
	defer tracing.End(span, err)
	if err != nil {
		n.notify(ctx, "StopContainer", err)
		return
	}
	n.update(ctx, "stop", rsp.GetUpdate())
}

// claimStop claims the delivery of id's stop if no path has yet; delivered must then
// be called once plugins have answered.
func (n *NRI) claimStop(id string) (delivered func(), claimed bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.claimStopLocked(id)
}

func (n *NRI) claimStopLocked(id string) (func(), bool) {
	switch n.state[id] {
	case stateCreated, stateRunning:
	default:
		return nil, false
	}
	n.state[id] = stateStopped
	ch := make(chan struct{})
	n.stopping[id] = ch
	return func() {
		n.mu.Lock()
		delete(n.stopping, id)
		n.mu.Unlock()
		close(ch)
	}, true
}

// awaitStop waits until the stop of id another path is delivering has been
// answered, or ctx ends.
func (n *NRI) awaitStop(ctx context.Context, id string) {
	n.mu.Lock()
	ch := n.stopping[id]
	n.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// RemoveContainer tells plugins a container is gone, stopping it for them first if
// they have not seen it stop; errors are logged.
func (n *NRI) RemoveContainer(ctx context.Context, p Pod, c Container) {
	if n == nil {
		return
	}
	n.StopContainer(ctx, p, c)
	if !n.claim(c.ID, stateNone, stateStopped) {
		return
	}
	n.notify(ctx, "RemoveContainer", n.hook(ctx, api.Event_REMOVE_CONTAINER, &p, &c, func(ctx context.Context) error {
		return n.a.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: p.toNRI(), Container: c.toNRI()})
	}))
}

// claim moves id to state to if it is in one of from, reporting whether it did: the
// one caller that does sends the event.
func (n *NRI) claim(id string, to state, from ...state) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	cur := n.state[id]
	for _, f := range from {
		if cur == f {
			if to == stateNone {
				delete(n.state, id)
			} else {
				n.state[id] = to
			}
			return true
		}
	}
	return false
}

func (n *NRI) setState(id string, s state) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.state[id] = s
}

func (n *NRI) getState(id string) state {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state[id]
}

func (n *NRI) runtime() Runtime {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rt
}

// hook runs call, the library's call for hook ev of pod p (and container c), as the
// hook's span.
func (n *NRI) hook(ctx context.Context, ev api.Event, p *Pod, c *Container, call func(context.Context) error) (err error) {
	ctx, span := startHook(ctx, ev, p, c)
	defer tracing.Finish(span, &err)
	return n.call(ctx, ev, call)
}

// call runs fn, a call into the library for hook ev, with the library's reports of
// plugins routed to ctx's hook span.
func (n *NRI) call(ctx context.Context, ev api.Event, fn func(context.Context) error) error {
	ps := n.enter(ctx, ev)
	defer n.leave(ps)
	return fn(ctx)
}

// notify logs the error of an event whose failure does not fail the CRI call.
func (n *NRI) notify(ctx context.Context, event string, err error) {
	if err != nil {
		n.log.ErrorContext(ctx, "NRI "+event+" notification failed", "err", err)
	}
}

// synchronize is the library's SyncFn: it hands a registering plugin every pod and
// every container not exited, and applies the updates the plugin answers with.
func (n *NRI) synchronize(ctx context.Context, cb adaptation.SyncCB) error {
	rt := n.runtime()
	if rt == nil {
		return errors.New("nri: plugin synchronization before criserver's state is recovered")
	}
	var pods []*api.PodSandbox
	for _, p := range rt.Pods() {
		pods = append(pods, p.toNRI())
	}
	var ctrs []*api.Container
	for _, c := range rt.Containers() {
		nc := c.toNRI()
		ctrs = append(ctrs, nc)
		switch nc.GetState() {
		case api.ContainerState_CONTAINER_CREATED:
			n.setState(c.ID, stateCreated)
		case api.ContainerState_CONTAINER_RUNNING, api.ContainerState_CONTAINER_PAUSED:
			n.setState(c.ID, stateRunning)
		case api.ContainerState_CONTAINER_STOPPED:
			n.setState(c.ID, stateStopped)
		}
	}
	ups, err := cb(ctx, pods, ctrs)
	if err != nil {
		return err
	}
	n.update(ctx, "synchronize", ups)
	return nil
}

// updateFromPlugin is the library's UpdateFn: a plugin's unsolicited UpdateContainers.
// It returns the updates that failed; an error too when one that must not fail did.
func (n *NRI) updateFromPlugin(ctx context.Context, ups []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
	return n.applyUpdates(ctx, ups)
}

func (n *NRI) applyUpdates(ctx context.Context, ups []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
	rt := n.runtime()
	if rt == nil || len(ups) == 0 {
		return nil, nil
	}
	var failed []*api.ContainerUpdate
	var errs []error
	for _, u := range ups {
		if err := rt.UpdateContainer(ctx, u.GetContainerId(), u.GetLinux().GetResources()); err != nil {
			failed = append(failed, u)
			if !u.GetIgnoreFailure() {
				errs = append(errs, fmt.Errorf("update container %s: %w", u.GetContainerId(), err))
			}
		}
	}
	return failed, errors.Join(errs...)
}

// update applies the updates plugins asked for along with an event, logging failures.
func (n *NRI) update(ctx context.Context, during string, ups []*api.ContainerUpdate) {
	if _, err := n.applyUpdates(ctx, ups); err != nil {
		n.log.WarnContext(ctx, "NRI container update asked for during "+during+" failed", "err", err)
	}
}

// evict stops the containers plugins asked to evict along with an event, logging failures.
func (n *NRI) evict(ctx context.Context, during string, evs []*api.ContainerEviction) {
	rt := n.runtime()
	if rt == nil {
		return
	}
	for _, e := range evs {
		if err := rt.EvictContainer(ctx, e.GetContainerId(), e.GetReason()); err != nil {
			n.log.WarnContext(ctx, "NRI eviction asked for during "+during+" failed", "container", e.GetContainerId(), "err", err)
		}
	}
}

// setLibraryLogger guards the one nrilog.Set of the process.
var setLibraryLogger sync.Once

// slogAdapter sends the library's log into criserver's.
type slogAdapter struct{ l *slog.Logger }

func (s slogAdapter) Debugf(ctx context.Context, f string, a ...any) {
	s.l.DebugContext(ctx, fmt.Sprintf(f, a...))
}
func (s slogAdapter) Infof(ctx context.Context, f string, a ...any) {
	s.l.InfoContext(ctx, fmt.Sprintf(f, a...))
}
func (s slogAdapter) Warnf(ctx context.Context, f string, a ...any) {
	s.l.WarnContext(ctx, fmt.Sprintf(f, a...))
}
func (s slogAdapter) Errorf(ctx context.Context, f string, a ...any) {
	s.l.ErrorContext(ctx, fmt.Sprintf(f, a...))
}
