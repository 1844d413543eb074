package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"
	"github.com/containerd/errdefs"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/protobuf/types/known/anypb"

	options "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/internal/network"
	"github.com/crisp-runtime/crisp/internal/network/netns"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/tracing"
	"github.com/crisp-runtime/crisp/tasksandbox"
)

// Create runs a pod: its record, bundle, network (namespace and CNI) beside its shim
// (started, or a warm spare's adopted), and its sandbox. On any failure everything it
// made is undone before it returns.
//
// What undoes what: before the record is written, register and recordIntent free the
// id and shut an adopted spare's shim down themselves. From the record on, one undo
// covers every later step: teardown, the path Recover takes for a record a crash left
// in phase creating, so that a failed Create and an interrupted one end alike. It
// undoes in reverse order what the record names and skips what was never made: the
// pause (StopSandbox, or the shim's delete), CNI (released) and the namespace, the shim
// (ShutdownSandbox, or a kill), its socket, the bundle, the record.
func (c *Controller) Create(ctx context.Context, spec Spec) (_ *Status, retErr error) {
	rec, err := c.newRecord(spec)
	if err != nil {
		return nil, err
	}
	// The warm spare NewSandboxID gave this id, if any: its shim runs and is
	// connected already.
	sp, err := c.claimSpare(ctx, spec.ID, spec.Handler)
	if err != nil {
		return nil, err
	}
	adopted := sp != nil
	if adopted {
		// Whatever the outcome, last: the spare's replacement may start then.
		defer c.adopted(spec.Handler)
	}
	sb, err := c.register(rec, sp)
	if err != nil {
		return nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if err := c.recordIntent(sb, adopted); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			c.undoCreate(sb)
		}
	}()

	if err := os.MkdirAll(sb.rec.Bundle, 0o711); err != nil {
		return nil, fmt.Errorf("create bundle for pod %s: %w", spec.ID, err)
	}
	pn, err := c.startNetwork(ctx, sb, spec)
	if err != nil {
		return nil, err
	}
	shimErr := c.startPodShim(ctx, sb, spec, adopted)
	shimTime := time.Since(pn.begun)
	netErr := pn.wait(ctx, shimErr)
	c.log.Debug("pod sandbox created", "pod", spec.ID, "netns", pn.nsTook, "cni", pn.cniTook, "shim", shimTime)
	if err := errors.Join(shimErr, netErr); err != nil {
		return nil, err
	}
	pn.observe(c.opts.Metrics)
	return c.markReady(sb, pn.res)
}

// newRecord checks that the pod's handler can run it and makes the pod's record, in
// phase creating. Nothing of the pod exists yet.
func (c *Controller) newRecord(spec Spec) (record, error) {
	rt, ok := c.opts.Runtimes[spec.Handler]
	if !ok {
		return record{}, fmt.Errorf("runtime handler %q is not configured: %w", spec.Handler, errdefs.ErrInvalidArgument)
	}
	shimBin, err := ResolveShim(rt.Shim)
	if err != nil {
		return record{}, fmt.Errorf("runtime handler %q: %w", spec.Handler, errdefs.ErrFailedPrecondition.WithMessage(err.Error()))
	}
	if rt.Mode() == config.SandboxModeTask && spec.Sandbox.GetUserns() != nil {
		return record{}, fmt.Errorf("runtime handler %q runs a task-only shim: crisp sets up user namespaces only with its own shim: %w", spec.Handler, errdefs.ErrInvalidArgument)
	}
	ns := rt.Namespace
	if ns == "" {
		ns = "k8s.io"
	}
	rec := record{
		Mode:        rt.Mode(),
		ID:          spec.ID,
		Phase:       phaseCreating,
		Handler:     spec.Handler,
		Shim:        shimBin,
		Namespace:   ns,
		Bundle:      filepath.Join(c.opts.bundleRoot(), spec.ID),
		HostNetwork: spec.HostNetwork,
		Pod: network.Pod{
			ID: spec.ID, Name: spec.Name, Namespace: spec.Namespace, UID: spec.UID,
			PortMappings: spec.PortMappings, Annotations: spec.Annotations, CgroupPath: spec.CgroupParent,
		},
		CreatedAt: time.Now(),
	}
	if !spec.HostNetwork {
		// Known before it exists, so that a crash right after creating it still leaves
		// a record that leads Recover to it.
		rec.NetNS = filepath.Join(c.opts.netnsDir(), spec.ID)
		rec.Pod.NetNS = rec.NetNS
	}
	return rec, nil
}

// register makes the pod known under its id, as the sandbox of the warm spare sp when
// one was claimed (its shim, namespace and address stay the spare's) or as a new one.
// A second pod of the id is refused, and the spare it claimed shut down.
func (c *Controller) register(rec record, sp *spare) (*sandbox, error) {
	var sb *sandbox
	if sp != nil {
		sb = sp.sb
		sb.mu.Lock()
		rec.Shim, rec.Namespace, rec.Address, rec.TaskAPI = sb.rec.Shim, sb.rec.Namespace, sb.rec.Address, sb.rec.TaskAPI
		sb.rec = rec
		sb.mu.Unlock()
	} else {
		sb = newSandbox(rec)
	}
	c.mu.Lock()
	if _, dup := c.sandboxes[rec.ID]; dup {
		c.mu.Unlock()
		if sp != nil {
			c.retireSpare(sb)
		}
		return nil, fmt.Errorf("sandbox %s: %w", rec.ID, errdefs.ErrAlreadyExists)
	}
	c.sandboxes[rec.ID] = sb
	c.mu.Unlock()
	return sb, nil
}

// recordIntent writes the pod's record before anything of the pod exists: a crash from
// here on is undone by Recover. An adopted spare's record goes in the same transaction:
// the shim always has exactly one owner on disk. When the write fails, the pod is
// forgotten and an adopted spare's shim shut down.
func (c *Controller) recordIntent(sb *sandbox, adopted bool) error {
	id := sb.rec.ID
	var err error
	if adopted {
		err = c.store.Apply(store.Op{Bucket: bucket, Key: id, Value: sb.rec}, store.Op{Bucket: spareBucket, Key: id, Delete: true})
	} else {
		err = c.store.Put(bucket, id, sb.rec)
	}
	if err != nil {
		c.forget(id)
		if adopted {
			c.retireSpare(sb)
		}
		return err
	}
	if adopted {
		_ = os.Remove(filepath.Join(sb.rec.Bundle, SpareMarker))
	}
	return nil
}

// undoCreate undoes a Create that failed after its record was written (see Create).
// It has a fresh context: the caller's may be what failed. When the teardown fails,
// the pod stays known, record and all, for a Remove or the next start to finish.
func (c *Controller) undoCreate(sb *sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.teardown(ctx, sb, 0, true); err != nil {
		c.log.Error("undo failed pod creation", "pod", sb.rec.ID, "err", err)
		return
	}
	c.forget(sb.rec.ID)
}

// markReady records the pod's addresses and its phase ready, and watches its pause
// process from now on, so that status and lists never have to ask the shim.
func (c *Controller) markReady(sb *sandbox, res *network.Result) (*Status, error) {
	sb.mu.Lock()
	if res != nil {
		if res.IP != nil {
			sb.rec.IP = res.IP.String()
		}
		for _, ip := range res.AdditionalIPs {
			sb.rec.AdditionalIPs = append(sb.rec.AdditionalIPs, ip.String())
		}
	}
	sb.rec.Phase = phaseReady
	rec := sb.rec
	sb.mu.Unlock()
	if err := c.store.Put(bucket, rec.ID, rec); err != nil {
		return nil, err
	}
	c.watch(sb)
	return sb.status(), nil
}

// netMode is how a pod gets its network.
type netMode int

const (
	// netHost is the node's network: nothing to set up.
	netHost netMode = iota
	// netOwn is a namespace the controller makes and pins before the shim starts; CNI
	// runs in it while the shim starts.
	netOwn
	// netUserns is the namespace of a pod with a user namespace: its pause process
	// makes it (owned by the pod's user namespace), so it is pinned, and CNI run,
	// once the sandbox has started.
	netUserns
)

// networkMode is how spec's pod gets its network.
func networkMode(spec Spec) netMode {
	switch {
	case spec.HostNetwork:
		return netHost
	case spec.Sandbox.GetUserns() != nil:
		return netUserns
	}
	return netOwn
}

// podNetwork is a pod's network step, the one part of Create that runs beside another:
// CNI runs while the shim starts, since neither needs the other until the pod is
// reported and together they are most of RunPodSandbox's time. startNetwork begins it,
// wait ends it, once, whatever the shim's start did; its undo is teardown's (CNI
// released, the namespace removed), told by the record's NetworkDone what CNI did.
type podNetwork struct {
	c    *Controller
	sb   *sandbox
	mode netMode
	// begun is when the namespace was there and CNI could begin: the shim's start and
	// CNI are timed from it. nsTook is how long the namespace took.
	begun  time.Time
	nsTook time.Duration
	// done is closed when CNI in the background is over. res, err, cniTook and cniRan
	// are the step's outcome, read after wait only.
	done    chan struct{}
	res     *network.Result
	err     error
	cniTook time.Duration
	cniRan  bool
}

// startNetwork begins the pod's network: it makes and pins the pod's own namespace at
// the path the record names, then starts CNI in it in the background. A host network
// needs nothing, and a user namespace pod's network waits for its sandbox (see wait).
func (c *Controller) startNetwork(ctx context.Context, sb *sandbox, spec Spec) (*podNetwork, error) {
	n := &podNetwork{c: c, sb: sb, mode: networkMode(spec), done: make(chan struct{})}
	t0 := time.Now()
	if n.mode == netOwn {
		_, span := tracing.Start(ctx, "controller.netns.create", tracing.AttrSandboxID.String(spec.ID))
		path, err := netns.New(c.opts.netnsDir(), spec.ID)
		if err != nil {
			err = fmt.Errorf("create network namespace for pod %s: %w", spec.ID, err)
		} else {
			err = checkPinned(spec.ID, path, sb.rec.NetNS)
		}
		tracing.End(span, err)
		if err != nil {
			return nil, err
		}
	}
	n.begun = time.Now()
	n.nsTook = n.begun.Sub(t0)
	if n.mode == netOwn {
		pod := sb.rec.Pod
		go func() {
			defer close(n.done)
			n.setupCNI(ctx, pod)
		}()
	}
	return n, nil
}

// wait ends the network step once the shim's start is over (shimErr its outcome) and
// returns the step's error. It waits for CNI in the background; a pod with a user
// namespace has the namespace its pause process made pinned and CNI run now, unless
// its sandbox never started. Either way it records whether CNI ran and may have
// allocated, so that teardown releases it.
func (n *podNetwork) wait(ctx context.Context, shimErr error) error {
	switch n.mode {
	case netOwn:
		<-n.done
	case netUserns:
		if shimErr != nil {
			break
		}
		if err := n.c.pinPauseNetNS(n.sb); err != nil {
			n.err = err
			break
		}
		n.setupCNI(ctx, n.sb.rec.Pod)
	}
	n.sb.mu.Lock()
	n.sb.rec.NetworkDone = n.mode == netHost || (n.cniRan && (n.res != nil || n.err == nil))
	n.sb.mu.Unlock()
	return n.err
}

// setupCNI runs CNI for the pod. Its time counts from begun: for a pod with a user
// namespace the shim's start is part of it.
func (n *podNetwork) setupCNI(ctx context.Context, pod network.Pod) {
	n.res, n.err = n.c.net.Setup(ctx, pod)
	n.cniTook, n.cniRan = time.Since(n.begun), true
}

// observe records the network phases of a pod start that succeeded: the namespace
// the controller made, and CNI.
func (n *podNetwork) observe(m *metrics.Metrics) {
	if n.mode == netOwn {
		m.ObservePodStartPhase(metrics.PhaseNetNS, n.nsTook)
	}
	if n.cniRan {
		m.ObservePodStartPhase(metrics.PhaseCNI, n.cniTook)
	}
}

// pinPauseNetNS pins the network namespace the pause process of a pod with a user
// namespace made, at the path the record names.
func (c *Controller) pinPauseNetNS(sb *sandbox) error {
	path, err := netns.Pin(c.opts.netnsDir(), sb.rec.ID, int(sb.rec.Pid))
	if err != nil {
		return fmt.Errorf("pin network namespace of pod %s (pause pid %d): %w", sb.rec.ID, sb.rec.Pid, err)
	}
	return checkPinned(sb.rec.ID, path, sb.rec.NetNS)
}

// checkPinned fails when a pod's namespace was pinned elsewhere than its record says:
// teardown would not find it there.
func checkPinned(id, path, want string) error {
	if path != want {
		return fmt.Errorf("network namespace of pod %s pinned at %s, expected %s", id, path, want)
	}
	return nil
}

// startPodShim gives the pod a running shim with its sandbox started, all within the
// shim start timeout: the shim (started, or a warm spare's adopted), the connection to
// it, then the sandbox. Its undo is teardown's: the pause stopped (or the shim's delete
// run), then ShutdownSandbox, or a kill of a shim that does not answer.
func (c *Controller) startPodShim(ctx context.Context, sb *sandbox, spec Spec, adopted bool) (retErr error) {
	sctx, cancel := context.WithTimeout(ctx, c.opts.ShimStartTimeout)
	defer cancel()
	sctx, span := tracing.Start(sctx, "controller.shim.start", tracing.AttrSandboxID.String(spec.ID),
		attribute.String("crisp.runtime_handler", spec.Handler), attribute.Bool("crisp.shim.warm_spare", adopted))
	defer tracing.Finish(span, &retErr)
	t0 := time.Now()
	if err := c.launchShim(sctx, sb, spec, adopted); err != nil {
		return err
	}
	t1 := time.Now()
	defer func() { c.observeShimStart(spec.ID, adopted, t0, t1, retErr) }()
	if !adopted {
		if err := c.connect(sctx, sb); err != nil {
			return fmt.Errorf("connect to shim of pod %s: %w", spec.ID, err)
		}
	}
	if sb.isTaskOnly() {
		if err := tasksandbox.RaisePauseOOMScore(sb.rec.Bundle, sb.shimPid); err != nil {
			return fmt.Errorf("pause container of pod %s: %w", spec.ID, err)
		}
	}
	return c.startSandbox(sctx, sb, spec)
}

// launchShim starts the pod's shim process, unless the pod adopted a warm spare's
// (running and connected already); a task-only shim's bundle is readied first.
func (c *Controller) launchShim(ctx context.Context, sb *sandbox, spec Spec, adopted bool) error {
	if sb.isTaskOnly() {
		if err := c.prepareTaskShim(sb, spec, adopted); err != nil {
			return err
		}
	}
	if adopted {
		return nil
	}
	_, span := tracing.Start(ctx, "controller.shim.launch", attribute.String("crisp.shim.binary", sb.rec.Shim))
	addr, version, err := c.startShimProcess(ctx, &sb.rec)
	tracing.End(span, err)
	if err != nil {
		return fmt.Errorf("start shim for pod %s: %w", spec.ID, err)
	}
	sb.rec.Address, sb.rec.TaskAPI = addr, version
	return nil
}

// observeShimStart logs how long the shim took to start (until t1) and to create and
// start the sandbox (since t1), and records both phases of a start that succeeded.
func (c *Controller) observeShimStart(id string, adopted bool, t0, t1 time.Time, err error) {
	c.log.Debug("shim started", "pod", id, "warm_spare", adopted, "bootstrap", t1.Sub(t0), "create_start", time.Since(t1))
	if err == nil {
		c.opts.Metrics.ObservePodStartPhase(metrics.PhaseShimStart, t1.Sub(t0))
		c.opts.Metrics.ObservePodStartPhase(metrics.PhaseSandboxStart, time.Since(t1))
	}
}

// startSandbox has the connected shim create and start the pod's sandbox, and records
// the pause process it answers with.
func (c *Controller) startSandbox(ctx context.Context, sb *sandbox, spec Spec) error {
	anyOpts, netnsPath, err := c.sandboxOptions(sb, spec)
	if err != nil {
		return err
	}
	tc := time.Now()
	if _, err := sb.svc.CreateSandbox(ctx, &sandboxapi.CreateSandboxRequest{
		SandboxID:   spec.ID,
		BundlePath:  sb.rec.Bundle,
		Options:     anyOpts,
		NetnsPath:   netnsPath,
		Annotations: spec.Annotations,
	}); err != nil {
		return fmt.Errorf("create sandbox %s in shim: %w", spec.ID, fromShim(err))
	}
	ts := time.Now()
	resp, err := sb.svc.StartSandbox(ctx, &sandboxapi.StartSandboxRequest{SandboxID: spec.ID})
	if err != nil {
		return fmt.Errorf("start sandbox %s in shim: %w", spec.ID, fromShim(err))
	}
	// sandbox_start's two parts: the shim's spec and cgroup work, and the pause process.
	c.opts.Metrics.ObservePodStartPhase(metrics.PhaseCreateSandbox, ts.Sub(tc))
	c.opts.Metrics.ObservePodStartPhase(metrics.PhaseStartSandbox, time.Since(ts))
	sb.rec.Pid = resp.GetPid()
	if t := resp.GetCreatedAt(); t != nil {
		sb.rec.CreatedAt = t.AsTime()
	}
	return nil
}

// sandboxOptions is what CreateSandbox tells the shim of the pod (crisp's
// SandboxOptions, completed from the Spec and the controller's options), and the
// network namespace the pod joins: none for a pod with a user namespace, whose pause
// process makes its own.
func (c *Controller) sandboxOptions(sb *sandbox, spec Spec) (*anypb.Any, string, error) {
	opts := spec.Sandbox
	if opts == nil {
		opts = &options.SandboxOptions{}
	}
	opts.CgroupParent = spec.CgroupParent
	opts.SystemdCgroup = c.opts.SystemdCgroup
	if spec.HostNetwork {
		opts.Network = options.NamespaceMode_NODE
	}
	netnsPath := sb.rec.NetNS
	if opts.GetUserns() != nil {
		// The controller pins it at rec.NetNS afterwards.
		netnsPath = ""
	}
	anyOpts, err := anypb.New(opts)
	if err != nil {
		return nil, "", fmt.Errorf("encode sandbox options: %w", err)
	}
	return anyOpts, netnsPath, nil
}
