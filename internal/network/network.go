package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/internal/network/netns"
	"github.com/crisp-runtime/crisp/internal/tracing"
)

// ifName is the pod's interface, as in every Kubernetes runtime.
const ifName = "eth0"

// ErrNotReady is wrapped by errors that mean no usable network config or plugin is installed.
var ErrNotReady = errors.New("pod network not ready")

// Pod is what CNI is told about a pod.
type Pod struct {
	ID           string // sandbox ID, the CNI container ID
	NetNS        string // path of the pinned network namespace
	Name         string
	Namespace    string
	UID          string
	PortMappings []PortMapping
	Annotations  map[string]string
	CgroupPath   string
}

// PortMapping is one host port forwarded to the pod.
type PortMapping struct {
	HostPort      int32
	ContainerPort int32
	Protocol      string // tcp|udp|sctp
	HostIP        string
}

// Result is the pod's network as the plugins set it up.
type Result struct {
	IP            net.IP // primary, IPv4 preferred
	AdditionalIPs []net.IP
	Interface     string
	Gateway       net.IP
}

// Manager runs the node's CNI network for pods. It is safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger
	cni *libcni.CNIConfig
	// uncached runs single plugins for a best-effort DEL without touching the real
	// result cache, so a failed teardown keeps the record it needs to be retried.
	uncached *libcni.CNIConfig

	mu    sync.Mutex
	state *confState
	// failures counts the failed teardowns of each pod (see pending.go).
	failures map[string]int
	// retrying is set while the background retrier of pending DELs runs.
	retrying bool

	// ctx ends the retrier at Close.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// masq is the runtime masquerade's rules (iptables.go).
	masq masqState

	// metrics records CNI ADD and DEL latency; atomic because the background retrier
	// may already run when SetMetrics is called. Nil records nothing.
	metrics atomic.Pointer[metrics.Metrics]
}

// SetMetrics has the manager record the latency of each pod's CNI ADD and DEL in m.
func (m *Manager) SetMetrics(mt *metrics.Metrics) { m.metrics.Store(mt) }

// New writes the default network config if cfg.ConfDir has none and loads the config to use.
// A missing or broken config is not an error here: Ready reports it until one appears.
func New(cfg Config, log *slog.Logger) (*Manager, error) {
	if log == nil {
		log = slog.Default()
	}
	cfg = cfg.withDefaults()
	if cfg.Masquerade != MasqueradeRuntime && cfg.Masquerade != MasqueradePlugin {
		return nil, fmt.Errorf("masquerade %q: must be %q or %q", cfg.Masquerade, MasqueradeRuntime, MasqueradePlugin)
	}
	// The pod CIDR kubelet gave before a restart stays in force until it gives another.
	podCIDR, err := readPodCIDR(cfg.PodCIDRFile)
	if err != nil {
		log.Warn("ignoring the kept pod CIDR: using the configured default subnet", "err", err, "subnet", cfg.DefaultSubnet)
	}
	configured := cfg.DefaultSubnet
	if podCIDR != "" {
		cfg.DefaultSubnet = podCIDR
	}
	// An explicit exec: libcni would otherwise create one lazily, racing between
	// concurrent Setup calls; and one whose timeout kills a plugin for good (exec.go).
	exec := &pluginExec{stderr: debugWriter{log}}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		cfg:      cfg,
		log:      log,
		cni:      libcni.NewCNIConfigWithCacheDir(cfg.BinDirs, cfg.CacheDir, exec),
		uncached: libcni.NewCNIConfigWithCacheDir(cfg.BinDirs, filepath.Join(cfg.CacheDir, "none"), exec),
		failures: map[string]int{},
		masq:     masqState{owner: masqOwner(cfg.CacheDir), inflight: map[string]int{}},
		ctx:      ctx,
		cancel:   cancel,
	}
	if err := m.init(configured); err != nil {
		cancel()
		return nil, err
	}
	// The rules go in now, for running pods and the next ones; should that fail, the
	// next pod's Setup tries again and fails with the reason.
	if err := m.syncMasq(ctx, m.masqSubnets()); err != nil {
		log.Error("install pod subnet masquerade rules", "err", err)
	}
	if err := os.MkdirAll(cfg.PendingDir, 0o700); err != nil {
		cancel()
		return nil, fmt.Errorf("create pending CNI DEL dir: %w", err)
	}
	// DELs left pending before a restart are picked up again.
	if ids := m.Pending(); len(ids) > 0 {
		log.Info("retrying CNI DELs left pending", "pods", ids)
		m.kickRetrier()
	}
	return m, nil
}

func (m *Manager) init(configured string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.applyDefaultLocked(configured); err != nil {
		return err
	}
	m.reloadLocked()
	return nil
}

// reloadLocked rescans the config dir if anything it depends on changed since the last
// scan: a few stats, so it is done on every Setup and Ready.
func (m *Manager) reloadLocked() {
	if m.state != nil && !m.state.stale() {
		return
	}
	old := m.state
	st := scan(m.cfg.ConfDir)
	m.state = st
	st.plan = masqPlan{list: st.list}
	var planErr error
	if st.list != nil && m.cfg.Masquerade == MasqueradeRuntime {
		if plan, err := planMasquerade(st.list); err != nil {
			planErr = err
		} else {
			st.plan = plan
		}
	}
	switch {
	case st.list != nil && (old == nil || old.list == nil || old.file != st.file || string(old.list.Bytes) != string(st.list.Bytes)):
		m.log.Info("loaded CNI network config", "file", st.file, "network", st.list.Name,
			"cni_version", st.list.CNIVersion, "plugins", pluginTypes(st.list))
		// Said once per config: why crisp does or does not masquerade for the plugin.
		if len(st.plan.subnets) > 0 {
			m.log.Info("crisp masquerades the bridge network's pod subnets itself (cni.masquerade = \"runtime\"); its ipMasq is off in memory, the file is unchanged",
				"subnets", joinCIDRs(st.plan.subnets), "chain", m.cfg.MasqueradeChain)
		}
		for _, why := range st.plan.kept {
			m.log.Info("bridge plugin keeps doing ipMasq per pod", "network", st.list.Name, "reason", why)
		}
		if planErr != nil {
			m.log.Warn("bridge plugin keeps doing ipMasq per pod", "network", st.list.Name, "err", planErr)
		}
	case st.list == nil && (old == nil || old.list != nil || old.err.Error() != st.err.Error()):
		m.log.Warn("no usable CNI network config", "err", st.err)
	}
}

// current returns the config to use for a new attachment.
func (m *Manager) current() (*libcni.NetworkConfigList, string, error) {
	plan, file, err := m.currentPlan()
	return plan.list, file, err
}

// currentPlan returns the config to use for a new attachment (with ipMasq off where
// crisp masquerades) and the subnets crisp masquerades for it.
func (m *Manager) currentPlan() (masqPlan, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reloadLocked()
	if m.state.list == nil {
		return masqPlan{}, "", fmt.Errorf("%w: %w", ErrNotReady, m.state.err)
	}
	return m.state.plan, m.state.file, nil
}

// masqSubnets returns the subnets crisp masquerades for the current config, if any.
func (m *Manager) masqSubnets() []*net.IPNet {
	plan, _, err := m.currentPlan()
	if err != nil {
		return nil
	}
	return plan.subnets
}

// NetworkName is the name of the network pods are attached to, or "" if none is configured.
func (m *Manager) NetworkName() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reloadLocked()
	if m.state.list == nil {
		return ""
	}
	return m.state.list.Name
}

// Ready returns nil when a network config is loaded and all its plugin binaries exist.
// It only stats files: it never runs a plugin.
func (m *Manager) Ready() error {
	list, file, err := m.current()
	if err != nil {
		return err
	}
	var missing []string
	for _, t := range pluginTypes(list) {
		if _, err := invoke.FindInPath(t, m.cfg.BinDirs); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: network %q (%s) needs CNI plugin(s) %s, not found in %s",
			ErrNotReady, list.Name, file, strings.Join(missing, ", "), strings.Join(m.cfg.BinDirs, ":"))
	}
	return nil
}

// Setup attaches the pod's namespace to the network (CNI ADD), within the configured
// timeout; a caller that gives up stops the ADD only Config.CancelGrace later, so that
// its plugins are not killed half-way for nothing. If the ADD fails, whatever the
// plugins did is undone (DEL) before the error is returned, or, should the DEL fail
// too, left to the background retrier.
//
// The ADD is span cni.add of ctx's trace, with a cni.plugin child per plugin run.
func (m *Manager) Setup(ctx context.Context, p Pod) (res *Result, err error) {
	ctx, span := tracing.Start(ctx, spanAdd)
	defer tracing.Finish(span, &err)
	setPodAttrs(span, p)
	if p.ID == "" || p.NetNS == "" {
		return nil, fmt.Errorf("set up network for pod %q: pod ID and netns path are required", p.ID)
	}
	plan, _, err := m.currentPlan()
	if err != nil {
		return nil, fmt.Errorf("set up network for pod %s (%s/%s): %w", p.ID, p.Namespace, p.Name, err)
	}
	list := plan.list
	if span.IsRecording() {
		span.SetAttributes(attrNetwork.String(list.Name), attrPlugins.Int(len(list.Plugins)))
	}
	// The check of the masquerade rules (now and then an iptables call) counts as part
	// of the ADD: it is what the plugin's ipMasq cost before.
	start := time.Now()
	// The plugin would have made the pod's NAT during ADD: the rule must be there first.
	release, err := m.ensureMasq(ctx, plan.subnets)
	if err != nil {
		err = fmt.Errorf("set up network %q for pod %s (%s/%s): %w", list.Name, p.ID, p.Namespace, p.Name, err)
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, unavailableError{err}
	}
	defer release()
	rt := runtimeConf(p)
	actx, cancel := withCallerGrace(ctx, m.cfg.Timeout, m.cfg.CancelGrace)
	raw, err := m.cni.AddNetworkList(actx, list, rt)
	cancel()
	if err == nil {
		res, err = parseResult(raw)
	}
	m.metrics.Load().ObserveCNI(metrics.CNIAdd, time.Since(start), err)
	if err != nil {
		err = fmt.Errorf("set up network %q for pod %s (%s/%s): %w", list.Name, p.ID, p.Namespace, p.Name, err)
		// The DEL runs even when ADD failed half-way (a veth made, an IP reserved), and
		// whatever ended the caller's context must not cut it short (del bounds it).
		// A plugin killed half-way may have reserved what the DEL cannot find.
		defer m.releaseUnowned(context.WithoutCancel(ctx), hostLocalStores(list))
		if derr := m.del(context.WithoutCancel(ctx), list, rt); derr != nil {
			m.log.Error("undo failed CNI ADD", "pod", p.ID, "network", list.Name, "err", derr)
			undo := *rt
			undo.NetNS = ""
			if perr := m.deferDel(list, &undo); perr != nil {
				return nil, fmt.Errorf("%w (undoing it also failed: %v; keeping it for a retry failed: %v)", err, derr, perr)
			}
			return nil, fmt.Errorf("%w (undoing it also failed, retried in the background: %v)", err, derr)
		}
		return nil, err
	}
	if span.IsRecording() {
		span.SetAttributes(attrPodIP.String(res.IP.String()))
	}
	m.log.Debug("pod network set up", "pod", p.ID, "network", list.Name, "ip", res.IP, "took", time.Since(start))
	return res, nil
}

// Teardown detaches the pod from the network (CNI DEL). It is idempotent and also
// succeeds when the namespace is gone or nothing was ever set up.
//
// The network, CNI args and capability args (port mappings) come from libcni's
// result cache when there is one, so a pod is torn down with the config it was set
// up with even if the operator changed the config since. An error means something
// the pod owned could not be removed; the cache entry is then kept for a retry. It is
// retryable (errdefs.ErrUnavailable, or context.DeadlineExceeded when a plugin was
// killed at the timeout) and names the network and plugin. After teardownAttempts
// failures of the same pod, Teardown hands the DEL to the background retrier and
// returns nil: the caller may then remove the namespace (see pending.go).
func (m *Manager) Teardown(ctx context.Context, p Pod) error {
	return m.teardown(ctx, p, teardownAttempts)
}

// Release is Teardown for a pod whose creation is being undone: kubelet never learned
// of it, so nobody would retry a failed DEL. The DEL goes to the background retrier at
// its first failure, and the error is nil unless even that failed.
//
// It also frees the host-local reservations without an owner that a plugin killed
// half-way leaves (see hostlocal.go): an undone creation is where a killed ADD ends up.
func (m *Manager) Release(ctx context.Context, p Pod) error {
	stores := m.storesOf(p.ID)
	err := m.teardown(ctx, p, 1)
	m.releaseUnowned(ctx, stores)
	return err
}

// teardown is Teardown that hands the DEL to the retrier after attempts failures.
func (m *Manager) teardown(ctx context.Context, p Pod, attempts int) error {
	if p.ID == "" {
		return errors.New("tear down pod network: pod ID is required")
	}
	if m.isPending(p.ID) {
		m.log.Debug("CNI DEL of pod is pending in the background", "pod", p.ID)
		return nil
	}
	start := time.Now()
	atts, err := m.cni.GetCachedAttachments(p.ID)
	if err != nil {
		m.log.Warn("read CNI result cache", "pod", p.ID, "err", err)
	}
	var errs []error
	var failed []attachment
	found := false
	for _, a := range atts {
		if a.ContainerID != p.ID || a.IfName != ifName {
			continue
		}
		list, err := libcni.NetworkConfFromBytes(a.Config)
		if err != nil {
			m.log.Warn("unreadable network config in CNI result cache, using the current one", "pod", p.ID, "network", a.Network, "err", err)
			continue
		}
		found = true
		nsPath := p.NetNS
		if nsPath == "" {
			nsPath = a.NetNS
		}
		rt := &libcni.RuntimeConf{ContainerID: p.ID, NetNS: liveNetNS(nsPath), IfName: a.IfName, Args: a.CniArgs, CapabilityArgs: a.CapabilityArgs}
		if err := m.delAttachment(ctx, list, rt); err != nil {
			errs = append(errs, fmt.Errorf("network %q: %w", list.Name, err))
			kept := *rt
			kept.NetNS = ""
			failed = append(failed, attachment{list: list, rt: &kept})
		}
	}
	if !found {
		// Never set up, already torn down, or the cache was lost. A DEL with the
		// current config is harmless in the first two cases and the best we can do in
		// the third, so its failure is logged rather than blocking pod removal forever.
		list, _, err := m.current()
		if err != nil {
			m.log.Warn("no CNI result cached and no network config: nothing to tear down", "pod", p.ID, "err", err)
			return nil
		}
		rt := runtimeConf(p)
		rt.NetNS = liveNetNS(p.NetNS)
		err = m.del(ctx, list, rt)
		m.metrics.Load().ObserveCNI(metrics.CNIDel, time.Since(start), err)
		if err != nil {
			m.log.Warn("best-effort CNI DEL of pod without cached result failed", "pod", p.ID, "network", list.Name, "err", err)
		}
		return nil
	}
	err = errors.Join(errs...)
	m.metrics.Load().ObserveCNI(metrics.CNIDel, time.Since(start), err)
	if err != nil {
		return m.teardownFailed(p, failed, attempts, err)
	}
	m.teardownDone(p.ID)
	m.log.Debug("pod network torn down", "pod", p.ID, "took", time.Since(start))
	return nil
}

// delAttachment runs DEL for a cached attachment, through a stand-in namespace when
// the pod's is gone and a plugin needs one (see standin.go).
func (m *Manager) delAttachment(ctx context.Context, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	if rt.NetNS != "" || !needsStandIn(list) {
		return m.del(ctx, list, rt)
	}
	addrs := m.cachedAddrs(list, rt)
	if len(addrs) == 0 {
		return m.del(ctx, list, rt)
	}
	sctx, span := tracing.Start(ctx, spanStandIn)
	if span.IsRecording() {
		span.SetAttributes(attrAddrs.Int(len(addrs)))
	}
	var delErr error
	err := withStandIn(rt.IfName, addrs, func(nsPath string) error {
		withNS := *rt
		withNS.NetNS = nsPath
		delErr = m.del(sctx, list, &withNS)
		return nil
	})
	tracing.End(span, err)
	if err != nil {
		m.log.Warn("no stand-in namespace for DEL, NAT rules of the pod may be left", "pod", rt.ContainerID, "err", err)
		return m.del(ctx, list, rt)
	}
	return delErr
}

// del runs DEL for the list. libcni stops at the first plugin that fails, which
// would leak what the plugins before it in the list made (an IP, a veth); so after a
// failure every plugin is called on its own, and only their failures are reported.
// Each of those calls has the configured timeout; a plugin that was killed at it is
// not called again (it would only hang again), so a DEL with one hanging plugin takes
// one timeout, not two.
//
// The DEL is span cni.del of ctx's trace, the plugin-by-plugin retry included.
func (m *Manager) del(ctx context.Context, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (err error) {
	ctx, span := startOp(ctx, spanDel, list, rt)
	defer tracing.Finish(span, &err)
	err = m.delList(ctx, m.cni, list, rt)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return err // the caller gave up: no point in going on
	}
	m.log.Warn("CNI DEL failed, retrying plugin by plugin", "pod", rt.ContainerID, "network", list.Name, "err", err)
	span.AddEvent("retrying plugin by plugin")
	var errs []error
	hung := timedOutPlugin(err)
	if hung != "" {
		errs = append(errs, err)
	}
	for i := len(list.Plugins) - 1; i >= 0; i-- {
		if list.Plugins[i].Network.Type == hung {
			continue
		}
		one := &libcni.NetworkConfigList{Name: list.Name, CNIVersion: list.CNIVersion, Plugins: list.Plugins[i : i+1], Bytes: list.Bytes}
		if err := m.delList(ctx, m.uncached, one, rt); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// All plugins are done: drop the cached result (a list without plugins only does that).
	return m.delList(ctx, m.cni, &libcni.NetworkConfigList{Name: list.Name, CNIVersion: list.CNIVersion}, rt)
}

// delList runs one DelNetworkList within the configured timeout.
func (m *Manager) delList(ctx context.Context, cni *libcni.CNIConfig, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	dctx, cancel := withTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	return cni.DelNetworkList(dctx, list, rt)
}

// liveNetNS returns path if a namespace is still there, else "". Plugins tolerate an
// empty netns on DEL (they release what lives outside it); a path to a file that is
// no namespace any more makes some of them fail on every retry.
func liveNetNS(path string) string {
	if netns.IsPinned(path) {
		return path
	}
	return ""
}

// runtimeConf is what kubelet's CNI users (containerd, CRI-O) pass for a pod.
func runtimeConf(p Pod) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: p.ID,
		NetNS:       p.NetNS,
		IfName:      ifName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", p.Namespace},
			{"K8S_POD_NAME", p.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.ID},
			{"K8S_POD_UID", p.UID},
		},
		CapabilityArgs: map[string]any{},
	}
	if pm := portMappings(p.PortMappings); len(pm) > 0 {
		rt.CapabilityArgs["portMappings"] = pm
	}
	if len(p.Annotations) > 0 {
		rt.CapabilityArgs["io.kubernetes.cri.pod-annotations"] = p.Annotations
	}
	if p.CgroupPath != "" {
		rt.CapabilityArgs["cgroupPath"] = p.CgroupPath
	}
	return rt
}

// cniPortMapping is the portMappings capability entry the portmap plugin reads.
type cniPortMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

func portMappings(pms []PortMapping) []cniPortMapping {
	var out []cniPortMapping
	for _, pm := range pms {
		// Kubernetes sends every declared containerPort; only those with a host port
		// are forwarded (hostPort 0 means none), as in containerd and CRI-O.
		if pm.HostPort <= 0 {
			continue
		}
		proto := strings.ToLower(pm.Protocol)
		if proto == "" {
			proto = "tcp"
		}
		out = append(out, cniPortMapping{HostPort: pm.HostPort, ContainerPort: pm.ContainerPort, Protocol: proto, HostIP: pm.HostIP})
	}
	return out
}

// parseResult picks the addresses of the pod's interface out of the plugins' result.
func parseResult(raw types.Result) (*Result, error) {
	// Converted to the current version so that a config with an older cniVersion works.
	r, err := types100.NewResultFromResult(raw)
	if err != nil {
		return nil, fmt.Errorf("convert CNI result: %w", err)
	}
	res := &Result{Interface: ifName}
	var ips []*types100.IPConfig
	for _, ipc := range r.IPs {
		if ipc == nil || ipc.Address.IP == nil {
			continue
		}
		if ipc.Interface != nil && *ipc.Interface >= 0 && *ipc.Interface < len(r.Interfaces) {
			iface := r.Interfaces[*ipc.Interface]
			if iface.Sandbox == "" {
				continue // an address on the host side (e.g. a bridge), not the pod's
			}
			res.Interface = iface.Name
		}
		ips = append(ips, ipc)
	}
	if len(ips) == 0 {
		return nil, errors.New("CNI result has no IP address for the pod")
	}
	primary := 0
	for i, ipc := range ips {
		if ipc.Address.IP.To4() != nil {
			primary = i
			break
		}
	}
	res.IP = ips[primary].Address.IP
	res.Gateway = ips[primary].Gateway
	for i, ipc := range ips {
		if i != primary {
			res.AdditionalIPs = append(res.AdditionalIPs, ipc.Address.IP)
		}
	}
	return res, nil
}

func pluginTypes(list *libcni.NetworkConfigList) []string {
	var ts []string
	for _, p := range list.Plugins {
		ts = append(ts, p.Network.Type)
		if t := p.Network.IPAM.Type; t != "" {
			ts = append(ts, t)
		}
	}
	return ts
}

// debugWriter sends what plugins print on stderr while succeeding to the debug log.
type debugWriter struct{ log *slog.Logger }

func (w debugWriter) Write(b []byte) (int, error) {
	w.log.Debug("CNI plugin stderr", "output", strings.TrimSpace(string(b)))
	return len(b), nil
}
