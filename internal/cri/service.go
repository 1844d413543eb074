package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/cri/apparmor"
	"github.com/crisp-runtime/crisp/internal/cri/spec"
	"github.com/crisp-runtime/crisp/internal/image"
	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/internal/network"
	"github.com/crisp-runtime/crisp/internal/nri"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/version"
)

// podBucket holds the CRI's record of each pod.
const podBucket = "pods"

// Service implements the CRI RuntimeService and ImageService. RPCs not built yet are
// answered by the embedded Unimplemented servers with codes.Unimplemented.
type Service struct {
	runtime.UnimplementedRuntimeServiceServer
	runtime.UnimplementedImageServiceServer

	cfg    config.Config
	store  *store.Store
	ctrl   *controller.Controller
	net    *network.Manager
	images *image.Service
	log    *slog.Logger
	// podNames and ctrNames reserve pod and container names (kubelet's attempts).
	podNames, ctrNames *nameIndex
	// stream hands out streaming URLs; nil until SetStreamServer.
	stream URLServer
	// evs fans container and pod lifecycle events out to GetContainerEvents.
	evs eventHub
	// rroSupported: the kernel has mount_setattr, so recursive_read_only mounts work
	// (probed once in New; Status advertises it per runtime handler).
	rroSupported bool
	// stats keeps the previous CPU samples and cached writable-layer usage of the
	// stats RPCs.
	stats statsState
	// usernsSupported: user namespaces and idmapped mounts on the filesystem of the
	// snapshots work here (probed once in New; Status advertises user_namespaces per
	// runtime handler and RunPodSandbox refuses userns pods without it).
	usernsSupported bool
	// features are each runtime handler's features (probeHandlers, once in New):
	// the node's, less what the handler's shim cannot run.
	features map[string]*runtime.RuntimeHandlerFeatures
	// metrics records pod and container start latency and container exits; nil (the
	// default) records nothing. Set by SetMetrics before serving.
	metrics *metrics.Metrics
	// cdi resolves CDI devices from cfg.CDI.SpecDirs (nil: CDI is off); one cache for
	// the life of the service, refreshed by the containers that request devices.
	cdi *spec.CDI
	// apparmor is the host's AppArmor (nil: none, or disable_apparmor).
	apparmor spec.AppArmor
	// labels hands out pods' and containers' SELinux labels and keeps their levels
	// reserved; every label is "" when SELinux is off or enable_selinux is false.
	labels *selinuxLabels
	// shmLabelOff is the SELinux context of pods' /dev/shm with labelling off on an
	// SELinux host (shmLabel); "" elsewhere.
	shmLabelOff string
	// nri relays pod and container events to NRI plugins and applies their
	// adjustments (nil: NRI is off). Set by SetNRI before serving.
	nri *nri.NRI

	// bg is the context of the container exit monitors; Close cancels it and waits
	// for them (monitors), so that no monitor takes the controller's closing of its
	// shim connections for an exit and records it.
	bg       context.Context
	stopBG   context.CancelFunc
	monitors sync.WaitGroup

	mu         sync.RWMutex
	pods       map[string]*pod
	containers map[string]*container
}

// pod is the CRI's view of one pod sandbox.
type pod struct {
	rec     podRecord
	config  *runtime.PodSandboxConfig
	nameKey string
	// entries are the pod's ListPodSandbox entries, not ready and ready, built on first
	// use: nothing else in them changes, and kubelet lists every pod every second.
	// Concurrent responses share them; they must not be modified.
	entries [2]atomic.Pointer[listed[*runtime.PodSandbox]]
}

// listEntry returns the pod's ListPodSandbox entry for its readiness.
func (p *pod) listEntry(ready bool) listed[*runtime.PodSandbox] {
	i, state := 0, runtime.PodSandboxState_SANDBOX_NOTREADY
	if ready {
		i, state = 1, runtime.PodSandboxState_SANDBOX_READY
	}
	if e := p.entries[i].Load(); e != nil {
		return *e
	}
	e := newListed(&runtime.PodSandbox{
		Id:             p.rec.ID,
		Metadata:       p.config.GetMetadata(),
		State:          state,
		CreatedAt:      p.rec.CreatedAt,
		Labels:         p.config.GetLabels(),
		Annotations:    p.config.GetAnnotations(),
		RuntimeHandler: p.rec.Handler,
	}, &runtime.PodSandbox{})
	p.entries[i].Store(&e)
	return e
}

// podRecord is what the store keeps of a pod.
type podRecord struct {
	ID        string          `json:"id"`
	Handler   string          `json:"handler"`
	CreatedAt int64           `json:"created_at"`
	Config    json.RawMessage `json:"config"`
	// Overhead and Resources are the pod-level values of UpdatePodSandboxResources
	// (protojson of LinuxContainerResources).
	Overhead  json.RawMessage `json:"overhead,omitempty"`
	Resources json.RawMessage `json:"resources,omitempty"`
	// ProcessLabel and MountLabel are the pod's SELinux labels ("" without SELinux):
	// kept so that a restarted criserver reserves the pod's level again and gives
	// the pod's later containers the same level.
	ProcessLabel string `json:"process_label,omitempty"`
	MountLabel   string `json:"mount_label,omitempty"`
}

// New returns the CRI service over a controller.
func New(cfg config.Config, st *store.Store, ctrl *controller.Controller, net *network.Manager, images *image.Service, log *slog.Logger) *Service {
	rro := spec.RecursiveReadOnlySupported()
	if !rro {
		log.Warn("kernel has no mount_setattr (Linux 5.12+): recursive read-only mounts are refused and not advertised")
	}
	// The rootfs layers are idmapped where the snapshots live (below RootDir).
	userns := true
	if err := spec.IDMappedMountsSupported(cfg.RootDir); err != nil {
		userns = false
		log.Warn("user namespaces are not supported here: pods with hostUsers: false are refused and not advertised", "err", err)
	}
	bg, stop := context.WithCancel(context.Background())
	feats := probeHandlers(bg, cfg, nodeFeatures{rro: rro, userns: userns}, log)
	svc := &Service{cfg: cfg, features: feats, store: st, ctrl: ctrl, net: net, images: images, log: log, rroSupported: rro, usernsSupported: userns, cdi: spec.NewCDI(cfg.CDI.SpecDirs), podNames: newNameIndex("pod"), ctrNames: newNameIndex("container"), pods: map[string]*pod{}, containers: map[string]*container{},
		bg: bg, stopBG: stop, labels: newSELinuxLabels(selinuxLib{})}
	svc.shmLabelOff = initSELinux(cfg, log)
	if aa := apparmor.New(cfg.DisableAppArmor); aa != nil {
		svc.apparmor = aa
		// Loaded now so that a broken apparmor_parser shows at start; every create
		// that needs it loads it again if it has been removed since.
		if name, err := aa.EnsureDefault(); err != nil {
			log.Error("AppArmor is enabled but crisp's default profile cannot be loaded: containers that need it will fail to create", "err", err)
		} else {
			log.Info("AppArmor enabled", "default_profile", name)
		}
	}
	return svc
}

// Close stops the container exit monitors and waits for them; call it before the
// controller's Close. Containers keep running; the next start monitors them again.
func (s *Service) Close() {
	s.stopBG()
	s.monitors.Wait()
}

// podName is the reservation key for a pod, as kubelet identifies one attempt.
func podName(md *runtime.PodSandboxMetadata) string {
	return strings.Join([]string{md.GetName(), md.GetNamespace(), md.GetUid(), fmt.Sprint(md.GetAttempt())}, "_")
}

// Version answers the CRI Version RPC.
func (s *Service) Version(context.Context, *runtime.VersionRequest) (*runtime.VersionResponse, error) {
	return &runtime.VersionResponse{
		Version:           "0.1.0",
		RuntimeName:       version.Name,
		RuntimeVersion:    version.Version,
		RuntimeApiVersion: "v1",
	}, nil
}

// handlerFeatures are what pods on a handler can have (probeHandlers decided them).
func (s *Service) handlerFeatures(name string) *runtime.RuntimeHandlerFeatures {
	f, ok := s.features[name]
	if !ok {
		return &runtime.RuntimeHandlerFeatures{}
	}
	return &runtime.RuntimeHandlerFeatures{RecursiveReadOnlyMounts: f.RecursiveReadOnlyMounts, UserNamespaces: f.UserNamespaces}
}

// usernsHostNetwork: user-namespaced pods on the host network can run here. A
// runtime-wide feature in the CRI, though only crisp's own shims run user-namespaced
// pods (handlerFeatures says which handlers do).
func (s *Service) usernsHostNetwork() bool {
	return s.usernsSupported && s.rroSupported
}

// Status reports whether the runtime and the pod network are ready, and the features
// kubelet checks before using them: per runtime handler recursive read-only mounts
// (when the kernel has mount_setattr: the OCI spec's "rro" option is what every
// handler's shim gets, and shim-runc's libcontainer applies it), user namespaces (when
// the kernel can idmap the snapshots' filesystem, see spec.IDMappedMountsSupported),
// and for the runtime SupplementalGroupsPolicy Strict and user-namespaced pods on the
// host network (kubelet's UserNamespacesHostNetworkSupport reads it; offered with user
// namespaces and mount_setattr, which the bound /sys of such pods needs).
func (s *Service) Status(_ context.Context, req *runtime.StatusRequest) (*runtime.StatusResponse, error) {
	runtimeReady := &runtime.RuntimeCondition{Type: runtime.RuntimeReady, Status: true}
	networkReady := &runtime.RuntimeCondition{Type: runtime.NetworkReady, Status: true}
	if err := s.net.Ready(); err != nil {
		networkReady.Status = false
		networkReady.Reason = "NetworkPluginNotReady"
		networkReady.Message = err.Error()
	}
	resp := &runtime.StatusResponse{
		Status: &runtime.RuntimeStatus{Conditions: []*runtime.RuntimeCondition{runtimeReady, networkReady}},
		// internal/cri/spec resolves supplemental groups itself and honours Strict (no groups
		// from the image's /etc/group); ContainerStatus.user reports the result.
		Features: &runtime.RuntimeFeatures{SupplementalGroupsPolicy: true, UserNamespacesHostNetwork: s.usernsHostNetwork()},
	}
	for _, name := range s.cfg.HandlerNames() {
		resp.RuntimeHandlers = append(resp.RuntimeHandlers, &runtime.RuntimeHandler{Name: name, Features: s.handlerFeatures(name)})
		if name == s.cfg.DefaultRuntimeHandler {
			// Kubelet looks up the default RuntimeClass under the empty name.
			resp.RuntimeHandlers = append(resp.RuntimeHandlers, &runtime.RuntimeHandler{Name: "", Features: s.handlerFeatures(name)})
		}
	}
	if req.GetVerbose() {
		cfg, _ := json.Marshal(s.cfg)
		s.mu.RLock()
		n := len(s.pods)
		s.mu.RUnlock()
		resp.Info = map[string]string{
			"config":  string(cfg),
			"version": version.Version,
			"network": s.net.NetworkName(),
			"pods":    fmt.Sprint(n),
		}
	}
	return resp, nil
}

// RuntimeConfig reports the cgroup driver so kubelet can match it.
func (s *Service) RuntimeConfig(context.Context, *runtime.RuntimeConfigRequest) (*runtime.RuntimeConfigResponse, error) {
	driver := runtime.CgroupDriver_CGROUPFS
	if s.cfg.CgroupDriver == config.CgroupDriverSystemd {
		driver = runtime.CgroupDriver_SYSTEMD
	}
	return &runtime.RuntimeConfigResponse{Linux: &runtime.LinuxRuntimeConfiguration{CgroupDriver: driver}}, nil
}

// resolvePod finds a pod by full id or unique id prefix.
func (s *Service) resolvePod(id string) (*pod, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return lookupPrefix(s.pods, id, "pod sandbox")
}

// lookupPrefix finds the entry of m whose key is id or the only key id prefixes, as
// crictl lets people type short ids.
func lookupPrefix[T any](m map[string]T, id, kind string) (T, error) {
	var zero T
	if id == "" {
		return zero, invalid("%s id is required", kind)
	}
	if v, ok := m[id]; ok {
		return v, nil
	}
	var keys []string
	for k := range m {
		if strings.HasPrefix(k, id) {
			keys = append(keys, k)
		}
	}
	switch len(keys) {
	case 0:
		return zero, fmt.Errorf("%s %q: %w", kind, id, errNotFound)
	case 1:
		return m[keys[0]], nil
	}
	sort.Strings(keys)
	return zero, invalid("%s id prefix %q is ambiguous: it matches %s", kind, id, strings.Join(keys, ", "))
}
