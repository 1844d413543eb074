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

	"github.com/containerd/errdefs"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/nri"
)

var errNotFound = errdefs.ErrNotFound

// pauseOOMScoreAdj is what containerd gives a pod's pause process; the shim clamps it
// to what it may set.
const pauseOOMScoreAdj = -998

// newID returns a fresh random id, as pod ids are made (64 hex digits).
func newID() string { return controller.NewID() }

func (s *Service) podDir(id string) string { return filepath.Join(s.cfg.RootDir, "pods", id) }

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
		// As containerd: plugins see each container's stop before the pod's (a no-op
		// or a wait when its exit is being delivered already).
		if s.nri.Enabled() {
			s.nri.StopContainer(ctx, s.nriPodOf(p.rec.ID), nriContainer(c, nil))
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
	s.labels.release(p.rec.ProcessLabel)
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
