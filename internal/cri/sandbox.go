package cri

import (
	"context"
	"encoding/json"
	"strconv"

	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/encoding/protojson"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	options "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/cri/spec"
	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/internal/network"
	"github.com/crisp-runtime/crisp/internal/nri"
)

var errNotFound = errdefs.ErrNotFound

// pauseOOMScoreAdj is what containerd gives a pod's pause process; the shim clamps it
// to what it may set.
const pauseOOMScoreAdj = -998

// newID returns a fresh random id, as pod ids are made (64 hex digits).
func newID() string { return controller.NewID() }

func (s *Service) podDir(id string) string { return filepath.Join(s.cfg.RootDir, "pods", id) }

// RunPodSandbox creates and starts a pod: each step below has its undo right after
// it, run if a later step fails, so a failed call leaves nothing behind.
func (s *Service) RunPodSandbox(ctx context.Context, req *runtime.RunPodSandboxRequest) (_ *runtime.RunPodSandboxResponse, retErr error) {
	defer func() { retErr = toStatus(retErr) }()
	begin := time.Now()
	cfg := req.GetConfig()
	if err := validatePodConfig(cfg, s.cfg.CgroupDriver); err != nil {
		return nil, err
	}
	handler := req.GetRuntimeHandler()
	if handler == "" {
		handler = s.cfg.DefaultRuntimeHandler
	}
	if !s.ctrl.HasHandler(handler) {
		return nil, invalid("runtime handler %q is not configured (configured: %s)", handler, strings.Join(s.cfg.HandlerNames(), ", "))
	}
	id := s.ctrl.NewSandboxID(handler)
	md := cfg.GetMetadata()
	log := s.log.With("pod", id, "name", md.GetName(), "namespace", md.GetNamespace())

	// 1. Reserve the name: a concurrent call with the same metadata fails here.
	nameKey := podName(md)
	if err := s.podNames.reserve(nameKey, id); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			s.podNames.release(nameKey, id)
		}
	}()

	// 2. The controller: netns, CNI, shim, pause. It undoes its own steps on failure.
	nsOpts := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	hostNet := nsOpts.GetNetwork() == runtime.NamespaceMode_NODE
	hostname := cfg.GetHostname()
	switch {
	case hostNet:
		// The pod shares the host's UTS namespace: its hostname is the node's.
		if h, err := os.Hostname(); err == nil {
			hostname = h
		}
	case hostname == "":
		hostname = md.GetName()
		if len(hostname) > maxHostname {
			hostname = hostname[:maxHostname]
		}
	}
	sysctls := map[string]string{}
	for k, v := range cfg.GetLinux().GetSysctls() {
		sysctls[strings.ReplaceAll(k, "/", ".")] = v
	}
	userNS, err := spec.PodUserNS(nsOpts)
	if err != nil {
		return nil, err
	}
	if userNS != nil && !s.usernsSupported {
		return nil, fmt.Errorf("%w: user namespaces are not supported on this node (see criserver's start-up log; Status does not advertise them)", errdefs.ErrFailedPrecondition)
	}
	uts := options.NamespaceMode_POD
	if hostNet {
		// A pod on the host network keeps the host's hostname, as kubelet expects.
		uts = options.NamespaceMode_NODE
	}
	ctrlSpec := controller.Spec{
		ID:          id,
		Handler:     handler,
		Name:        md.GetName(),
		Namespace:   md.GetNamespace(),
		UID:         md.GetUid(),
		HostNetwork: hostNet,
		Sandbox: &options.SandboxOptions{
			Hostname:    podHostname(hostname, hostNet),
			Network:     options.NamespaceMode(nsOpts.GetNetwork()),
			Pid:         options.NamespaceMode(nsOpts.GetPid()),
			Ipc:         options.NamespaceMode(nsOpts.GetIpc()),
			Uts:         uts,
			Sysctls:     sysctls,
			OomScoreAdj: pauseOOMScoreAdj,
		},
		Annotations:  cfg.GetAnnotations(),
		CgroupParent: cfg.GetLinux().GetCgroupParent(),
	}
	ctrlSpec.PauseAnnotations = pauseAnnotations(cfg, handler)
	// Only a task-only shim's pod runs its pause as an OCI container; validatePodConfig
	// already refused a cgroup_parent the driver cannot take.
	if ctrlSpec.PauseCgroupsPath, err = spec.CgroupsPath(ctrlSpec.CgroupParent, id, s.cfg.CgroupDriver == "systemd"); err != nil {
		return nil, err
	}
	for _, pm := range cfg.GetPortMappings() {
		ctrlSpec.PortMappings = append(ctrlSpec.PortMappings, network.PortMapping{
			HostPort:      pm.GetHostPort(),
			ContainerPort: pm.GetContainerPort(),
			Protocol:      strings.ToLower(pm.GetProtocol().String()),
			HostIP:        pm.GetHostIp(),
		})
	}
	start := time.Now()
	if userNS != nil {
		ctrlSpec.Sandbox.Userns = &options.UserNamespace{
			Uids: []*options.IDMapping{{ContainerId: userNS.UID.ContainerID, HostId: userNS.UID.HostID, Size: userNS.UID.Size}},
			Gids: []*options.IDMapping{{ContainerId: userNS.GID.ContainerID, HostId: userNS.GID.HostID, Size: userNS.GID.Size}},
		}
	}
	st, err := s.ctrl.Create(ctx, ctrlSpec)
	if err != nil {
		return nil, fmt.Errorf("run pod sandbox %s (%s/%s): %w", id, md.GetNamespace(), md.GetName(), err)
	}
	defer func() {
		if retErr != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := s.ctrl.Remove(cctx, id); err != nil {
				log.Error("undo sandbox after failed RunPodSandbox", "err", err)
			}
		}
	}()

	// 3. The /dev/shm the pod's containers share (with its IPC namespace).
	if err := s.mountShm(id, cfg); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			s.unmountShm(id)
		}
	}()

	// 4. The files containers will bind-mount.
	ph := phases{}
	end := ph.start(metrics.PhasePodFiles)
	err = podFiles(s.podDir(id), hostname, st.IP, cfg, hostNet)
	end()
	if err != nil {
		return nil, fmt.Errorf("prepare files of pod %s: %w", id, err)
	}
	defer func() {
		if retErr != nil {
			_ = os.RemoveAll(s.podDir(id))
		}
	}()

	raw, err := protojson.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode pod config: %w", err)
	}
	p := &pod{
		rec:     podRecord{ID: id, Handler: handler, CreatedAt: st.CreatedAt.UnixNano(), Config: raw},
		config:  cfg,
		nameKey: nameKey,
	}

	// 5. NRI plugins see the pod once it is up, before it is listed; their error fails
	// the call, as in containerd. They may not synchronize until the pod is listed.
	if s.nri.Enabled() {
		defer s.nri.BlockSync().Unblock()
		np := s.nriPod(p)
		np.CgroupsPath = ctrlSpec.PauseCgroupsPath
		if err := s.nri.RunPodSandbox(ctx, np); err != nil {
			return nil, fmt.Errorf("NRI RunPodSandbox of pod %s: %w", id, err)
		}
		defer func() {
			if retErr != nil {
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				s.nri.RemovePodSandbox(cctx, np)
			}
		}()
	}

	// 6. Persist the CRI record; from here the pod exists.
	if err := s.store.Put(podBucket, id, p.rec); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.pods[id] = p
	s.mu.Unlock()
	// As containerd does: the sandbox reports itself as a container (id = pod id),
	// created and started, for kubelet's evented PLEG.
	s.emitPodEvent(p, runtime.ContainerEventType_CONTAINER_CREATED_EVENT)
	s.emitPodEvent(p, runtime.ContainerEventType_CONTAINER_STARTED_EVENT)
	s.metrics.ObservePodStart(time.Since(begin))
	ph.observe(s.metrics.ObservePodStartPhase)
	log.Info("pod sandbox ready", "ip", st.IP, "duration", time.Since(start))
	return &runtime.RunPodSandboxResponse{PodSandboxId: id}, nil
}

// podHostname is the hostname the shim sets: none when the pod keeps the host's.
func podHostname(hostname string, hostNet bool) string {
	if hostNet {
		return ""
	}
	return hostname
}

// StopPodSandbox stops the pod's processes and frees its network. Unknown ids
// succeed: kubelet retries stops and must not be wedged by one already done.
func (s *Service) StopPodSandbox(ctx context.Context, req *runtime.StopPodSandboxRequest) (*runtime.StopPodSandboxResponse, error) {
	p, err := s.resolvePod(req.GetPodSandboxId())
	if errdefs.IsNotFound(err) {
		return &runtime.StopPodSandboxResponse{}, nil
	}
	if err != nil {
		return nil, toStatus(err)
	}
	// Containers first: the CRI says they are forcibly stopped with the pod.
	for _, c := range s.containersOf(p.rec.ID) {
		c.op.Lock()
		err := s.stopContainer(ctx, c, 0)
		c.op.Unlock()
		if err != nil {
			return nil, toStatus(fmt.Errorf("stop container %s of pod %s: %w", c.rec.ID, p.rec.ID, err))
		}
	}
	if err := s.ctrl.Stop(ctx, p.rec.ID, 0); err != nil {
		return nil, toStatus(fmt.Errorf("stop pod sandbox %s: %w", p.rec.ID, err))
	}
	if s.nri.Enabled() {
		s.nri.StopPodSandbox(ctx, s.nriPod(p))
	}
	s.unmountShm(p.rec.ID)
	if s.evs.markStopped(p.rec.ID) {
		s.emitPodEvent(p, runtime.ContainerEventType_CONTAINER_STOPPED_EVENT)
	}
	return &runtime.StopPodSandboxResponse{}, nil
}

// RemovePodSandbox removes a pod and everything of it, stopping it first if needed.
// Unknown ids succeed.
func (s *Service) RemovePodSandbox(ctx context.Context, req *runtime.RemovePodSandboxRequest) (*runtime.RemovePodSandboxResponse, error) {
	p, err := s.resolvePod(req.GetPodSandboxId())
	if errdefs.IsNotFound(err) {
		return &runtime.RemovePodSandboxResponse{}, nil
	}
	if err != nil {
		return nil, toStatus(err)
	}
	id := p.rec.ID
	var nriPod nri.Pod
	if s.nri.Enabled() {
		// Taken while the sandbox is there to report its address.
		nriPod = s.nriPod(p)
	}
	for _, c := range s.containersOf(id) {
		if err := s.removeContainer(ctx, c); err != nil {
			return nil, toStatus(fmt.Errorf("remove container %s of pod %s: %w", c.rec.ID, id, err))
		}
	}
	if err := s.ctrl.Remove(ctx, id); err != nil {
		return nil, toStatus(fmt.Errorf("remove pod sandbox %s: %w", id, err))
	}
	// The statuses the events carry are taken while the pod still exists: kubelet
	// needs the pod's metadata even in the DELETED event.
	evState := s.podEventStatus(p)
	s.unmountShm(id)
	if err := os.RemoveAll(s.podStateDir(id)); err != nil {
		return nil, toStatus(fmt.Errorf("remove state of pod %s: %w", id, err))
	}
	if err := os.RemoveAll(s.podDir(id)); err != nil {
		return nil, toStatus(fmt.Errorf("remove files of pod %s: %w", id, err))
	}
	if err := s.store.Delete(podBucket, id); err != nil {
		return nil, toStatus(err)
	}
	if s.nri.Enabled() {
		s.nri.RemovePodSandbox(ctx, nriPod)
	}
	s.mu.Lock()
	delete(s.pods, id)
	s.mu.Unlock()
	s.podNames.release(p.nameKey, id)
	if s.evs.markStopped(id) {
		s.publishEvent(id, runtime.ContainerEventType_CONTAINER_STOPPED_EVENT, evState)
	}
	s.publishEvent(id, runtime.ContainerEventType_CONTAINER_DELETED_EVENT, evState)
	s.evs.forget(id)
	s.log.Info("pod sandbox removed", "pod", id)
	return &runtime.RemovePodSandboxResponse{}, nil
}

// PodSandboxStatus reports a pod's state, network and config.
func (s *Service) PodSandboxStatus(ctx context.Context, req *runtime.PodSandboxStatusRequest) (*runtime.PodSandboxStatusResponse, error) {
	p, err := s.resolvePod(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	st, _ := s.ctrl.Status(p.rec.ID)
	resp := &runtime.PodSandboxStatusResponse{Status: s.podStatus(p, st)}
	if req.GetVerbose() {
		info := map[string]any{
			"runtimeHandler": p.rec.Handler,
			"config":         json.RawMessage(p.rec.Config),
			"podDir":         s.podDir(p.rec.ID),
		}
		s.mu.RLock()
		if rec := p.rec; len(rec.Overhead) > 0 || len(rec.Resources) > 0 {
			info["overhead"], info["resources"] = rawOrNil(rec.Overhead), rawOrNil(rec.Resources)
		}
		s.mu.RUnlock()
		if st != nil {
			info["pid"] = st.Pid
			info["shimPid"] = st.ShimPid
			info["shimAddress"] = st.Address
			info["netNamespacePath"] = st.NetNS
			info["shimAlive"] = st.ShimAlive
			if shimInfo, err := s.ctrl.Info(ctx, p.rec.ID); err == nil {
				info["shim"] = shimInfo
			} else {
				info["shimError"] = err.Error()
			}
		}
		data, err := json.Marshal(info)
		if err != nil {
			return nil, toStatus(fmt.Errorf("encode verbose info: %w", err))
		}
		resp.Info = map[string]string{"info": string(data)}
	}
	return resp, nil
}

func (s *Service) podStatus(p *pod, st *controller.Status) *runtime.PodSandboxStatus {
	cfg := p.config
	state := runtime.PodSandboxState_SANDBOX_NOTREADY
	var ip string
	var extra []*runtime.PodIP
	if st != nil {
		if st.State == controller.StateReady {
			state = runtime.PodSandboxState_SANDBOX_READY
		}
		ip = st.IP
		for _, a := range st.AdditionalIPs {
			extra = append(extra, &runtime.PodIP{Ip: a})
		}
	}
	nsOpts := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	return &runtime.PodSandboxStatus{
		Id:        p.rec.ID,
		Metadata:  cfg.GetMetadata(),
		State:     state,
		CreatedAt: p.rec.CreatedAt,
		Network:   &runtime.PodSandboxNetworkStatus{Ip: ip, AdditionalIps: extra},
		Linux: &runtime.LinuxPodSandboxStatus{Namespaces: &runtime.Namespace{Options: &runtime.NamespaceOption{
			Network:  nsOpts.GetNetwork(),
			Pid:      nsOpts.GetPid(),
			Ipc:      nsOpts.GetIpc(),
			TargetId: nsOpts.GetTargetId(),
			// The CRI's own message: mode and the mappings the pod runs with.
			UsernsOptions: nsOpts.GetUsernsOptions(),
		}}},
		Labels:         cfg.GetLabels(),
		Annotations:    cfg.GetAnnotations(),
		RuntimeHandler: p.rec.Handler,
	}
}

// ListPodSandbox lists pods matching the filter: id (or unique prefix), state, labels.
func (s *Service) ListPodSandbox(_ context.Context, req *runtime.ListPodSandboxRequest) (*runtime.ListPodSandboxResponse, error) {
	return &runtime.ListPodSandboxResponse{Items: wiresOf(s.listPodSandboxes(req.GetFilter()))}, nil
}

// podsWithPrefix returns the pods whose id starts with prefix (all for "").
func (s *Service) podsWithPrefix(prefix string) []*pod {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pods := make([]*pod, 0, len(s.pods))
	for id, p := range s.pods {
		if strings.HasPrefix(id, prefix) {
			pods = append(pods, p)
		}
	}
	return pods
}

// listPodSandboxes is the one filter ListPodSandbox and StreamPodSandboxes share,
// oldest pod first.
func (s *Service) listPodSandboxes(f *runtime.PodSandboxFilter) []listed[*runtime.PodSandbox] {
	pods := s.podsWithPrefix(f.GetId())
	sort.Slice(pods, func(i, j int) bool { return pods[i].rec.CreatedAt < pods[j].rec.CreatedAt })
	items := make([]listed[*runtime.PodSandbox], 0, len(pods))
	for _, p := range pods {
		// Only the state: kubelet lists every second, and building each pod's full
		// status here showed up in the List latency.
		l := p.listEntry(s.ctrl.Ready(p.rec.ID))
		e := l.entry
		if f.GetState() != nil && f.GetState().GetState() != e.State {
			continue
		}
		if !labelsMatch(e.Labels, f.GetLabelSelector()) {
			continue
		}
		items = append(items, l)
	}
	return items
}

func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// rawOrNil keeps an absent JSON value null in verbose info instead of invalid JSON.
func rawOrNil(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

// pauseAnnotations are the annotations containerd puts on a pod's sandbox container
// besides the pod's own and the sandbox id, name, namespace and uid: task-only shims
// that run a pod in a VM (Kata) size it from the pod's resources in them.
func pauseAnnotations(cfg *runtime.PodSandboxConfig, handler string) map[string]string {
	a := map[string]string{
		"io.kubernetes.cri.sandbox-log-directory": cfg.GetLogDirectory(),
		"io.containerd.cri.runtime-handler":       handler,
	}
	if res := cfg.GetLinux().GetResources(); res != nil {
		a["io.kubernetes.cri.sandbox-cpu-period"] = strconv.FormatInt(res.GetCpuPeriod(), 10)
		a["io.kubernetes.cri.sandbox-cpu-quota"] = strconv.FormatInt(res.GetCpuQuota(), 10)
		a["io.kubernetes.cri.sandbox-cpu-shares"] = strconv.FormatInt(res.GetCpuShares(), 10)
		a["io.kubernetes.cri.sandbox-memory"] = strconv.FormatInt(res.GetMemoryLimitInBytes(), 10)
	}
	return a
}
