package cri

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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

// podRun is what RunPodSandbox's steps hand to each other.
type podRun struct {
	id, handler, nameKey string
	cfg                  *runtime.PodSandboxConfig
	md                   *runtime.PodSandboxMetadata
	log                  *slog.Logger
	hostNet              bool
	hostname             string
	// processLabel and mountLabel are the pod's SELinux labels ("" without SELinux).
	processLabel, mountLabel string
	spec                     controller.Spec
	st                       *controller.Status
	// start is when the controller was asked for the sandbox: the ready log's duration.
	start time.Time
	ph    phases
}

// RunPodSandbox creates and starts a pod: each step below has its undo right after
// it, run if a later step fails, so a failed call leaves nothing behind.
func (s *Service) RunPodSandbox(ctx context.Context, req *runtime.RunPodSandboxRequest) (_ *runtime.RunPodSandboxResponse, retErr error) {
	defer func() { retErr = toStatus(retErr) }()
	begin := time.Now()
	r, err := s.newPodRun(req)
	if err != nil {
		return nil, err
	}

	// 1. Reserve the name: a concurrent call with the same metadata fails here.
	if err := s.podNames.reserve(r.nameKey, r.id); err != nil {
		return nil, err
	}
	defer onFailure(&retErr, func() { s.podNames.release(r.nameKey, r.id) })

	// 1b. The pod's SELinux labels: its level is reserved from here.
	if r.processLabel, r.mountLabel, err = s.podSELinuxLabels(r); err != nil {
		return nil, err
	}
	defer onFailure(&retErr, func() { s.labels.release(r.processLabel) })

	// 2. The controller: netns, CNI, shim, pause. It undoes its own steps on failure.
	if err := s.createSandbox(ctx, r); err != nil {
		return nil, err
	}
	defer onFailure(&retErr, func() { s.removeFailedSandbox(r) })

	// 3. The /dev/shm the pod's containers share (with its IPC namespace).
	if err := s.mountShm(r.id, r.cfg, r.mountLabel); err != nil {
		return nil, err
	}
	defer onFailure(&retErr, func() { s.unmountShm(r.id) })

	// 4. The files containers will bind-mount.
	if err := s.writePodFiles(r); err != nil {
		return nil, err
	}
	defer onFailure(&retErr, func() { _ = os.RemoveAll(s.podDir(r.id)) })
	p, err := newRunPod(r)
	if err != nil {
		return nil, err
	}

	// 5. NRI plugins see the pod once it is up, before it is listed; their error fails
	// the call, as in containerd. They may not synchronize until the pod is listed.
	if s.nri.Enabled() {
		defer s.nri.BlockSync().Unblock()
		np, err := s.nriRunPodSandbox(ctx, r, p)
		if err != nil {
			return nil, err
		}
		defer onFailure(&retErr, func() { s.nriRemoveFailedPod(np) })
	}

	// 6. Persist the CRI record; from here the pod exists.
	if err := s.listPod(p); err != nil {
		return nil, err
	}
	s.podRunDone(r, begin)
	return &runtime.RunPodSandboxResponse{PodSandboxId: r.id}, nil
}

// onFailure runs undo if the call that deferred it returns an error in *retErr: the
// undo of a step, deferred right after the step succeeded.
func onFailure(retErr *error, undo func()) {
	if *retErr != nil {
		undo()
	}
}

// newPodRun checks the request and picks the pod's handler and id; nothing to undo.
func (s *Service) newPodRun(req *runtime.RunPodSandboxRequest) (*podRun, error) {
	cfg := req.GetConfig()
	if err := validatePodConfig(cfg, s.cfg.CgroupDriver); err != nil {
		return nil, err
	}
	// Kept as the pod will run: every later use of the config (containers' cgroups,
	// stats, NRI, the record) then sees the slice, not the path it was given as.
	if l := cfg.GetLinux(); l.GetCgroupParent() != "" {
		l.CgroupParent = cgroupParent(l.GetCgroupParent(), s.cfg.CgroupDriver)
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
	return &podRun{
		id:      id,
		handler: handler,
		nameKey: podName(md),
		cfg:     cfg,
		md:      md,
		log:     s.log.With("pod", id, "name", md.GetName(), "namespace", md.GetNamespace()),
		hostNet: cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtime.NamespaceMode_NODE,
		ph:      phases{},
	}, nil
}

// createSandbox asks the controller for the pod's sandbox; undone by removeFailedSandbox.
func (s *Service) createSandbox(ctx context.Context, r *podRun) error {
	r.hostname = runPodHostname(r.cfg, r.hostNet)
	var err error
	if r.spec, err = s.sandboxSpec(r); err != nil {
		return err
	}
	r.start = time.Now()
	if r.st, err = s.ctrl.Create(ctx, r.spec); err != nil {
		return fmt.Errorf("run pod sandbox %s (%s/%s): %w", r.id, r.md.GetNamespace(), r.md.GetName(), err)
	}
	return nil
}

// removeFailedSandbox undoes createSandbox, on its own deadline: ctx may be what failed.
func (s *Service) removeFailedSandbox(r *podRun) {
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.ctrl.Remove(cctx, r.id); err != nil {
		r.log.Error("undo sandbox after failed RunPodSandbox", "err", err)
	}
}

// runPodHostname is the pod's hostname: the node's on the host network, else the
// config's or, without one, the pod's name cut to what the kernel takes.
func runPodHostname(cfg *runtime.PodSandboxConfig, hostNet bool) string {
	hostname := cfg.GetHostname()
	switch {
	case hostNet:
		// The pod shares the host's UTS namespace: its hostname is the node's.
		if h, err := os.Hostname(); err == nil {
			hostname = h
		}
	case hostname == "":
		hostname = cfg.GetMetadata().GetName()
		if len(hostname) > maxHostname {
			hostname = hostname[:maxHostname]
		}
	}
	return hostname
}

// sandboxSpec is the controller's spec of the pod; it has no side effects.
func (s *Service) sandboxSpec(r *podRun) (controller.Spec, error) {
	cfg, md := r.cfg, r.md
	nsOpts := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	sysctls := map[string]string{}
	for k, v := range cfg.GetLinux().GetSysctls() {
		sysctls[strings.ReplaceAll(k, "/", ".")] = v
	}
	userNS, err := spec.PodUserNS(nsOpts)
	if err != nil {
		return controller.Spec{}, err
	}
	if userNS != nil && !s.usernsSupported {
		return controller.Spec{}, fmt.Errorf("%w: user namespaces are not supported on this node (see criserver's start-up log; Status does not advertise them)", errdefs.ErrFailedPrecondition)
	}
	if userNS != nil && !s.handlerFeatures(r.handler).UserNamespaces {
		return controller.Spec{}, fmt.Errorf("%w: runtime handler %q does not run pods in user namespaces (its shim does not offer them; Status does not advertise them for it): use a handler that does, or hostUsers: true", errdefs.ErrFailedPrecondition, r.handler)
	}
	uts := options.NamespaceMode_POD
	if r.hostNet {
		// A pod on the host network keeps the host's hostname, as kubelet expects.
		uts = options.NamespaceMode_NODE
	}
	ctrlSpec := controller.Spec{
		ID:          r.id,
		Handler:     r.handler,
		Name:        md.GetName(),
		Namespace:   md.GetNamespace(),
		UID:         md.GetUid(),
		HostNetwork: r.hostNet,
		Sandbox: &options.SandboxOptions{
			Hostname:     podHostname(r.hostname, r.hostNet),
			Network:      options.NamespaceMode(nsOpts.GetNetwork()),
			Pid:          options.NamespaceMode(nsOpts.GetPid()),
			Ipc:          options.NamespaceMode(nsOpts.GetIpc()),
			Uts:          uts,
			Sysctls:      sysctls,
			OomScoreAdj:  pauseOOMScoreAdj,
			SelinuxLabel: pauseLabel(r),
			MountLabel:   r.mountLabel,
		},
		Annotations:  cfg.GetAnnotations(),
		CgroupParent: cfg.GetLinux().GetCgroupParent(),
	}
	ctrlSpec.PauseAnnotations = pauseAnnotations(cfg, r.handler)
	// Only a task-only shim's pod runs its pause as an OCI container; validatePodConfig
	// already refused a cgroup_parent the driver cannot take.
	if ctrlSpec.PauseCgroupsPath, err = spec.CgroupsPath(ctrlSpec.CgroupParent, r.id, s.cfg.CgroupDriver == "systemd"); err != nil {
		return controller.Spec{}, err
	}
	ctrlSpec.PortMappings = portMappings(cfg)
	if userNS != nil {
		ctrlSpec.Sandbox.Userns = &options.UserNamespace{
			Uids: []*options.IDMapping{{ContainerId: userNS.UID.ContainerID, HostId: userNS.UID.HostID, Size: userNS.UID.Size}},
			Gids: []*options.IDMapping{{ContainerId: userNS.GID.ContainerID, HostId: userNS.GID.HostID, Size: userNS.GID.Size}},
		}
	}
	return ctrlSpec, nil
}

// portMappings are the pod's port mappings as the network package takes them (nil for none).
func portMappings(cfg *runtime.PodSandboxConfig) []network.PortMapping {
	var pms []network.PortMapping
	for _, pm := range cfg.GetPortMappings() {
		pms = append(pms, network.PortMapping{
			HostPort:      pm.GetHostPort(),
			ContainerPort: pm.GetContainerPort(),
			Protocol:      strings.ToLower(pm.GetProtocol().String()),
			HostIP:        pm.GetHostIp(),
		})
	}
	return pms
}

// writePodFiles writes the files the pod's containers bind-mount, timed as a phase;
// undone by removing the pod's directory.
func (s *Service) writePodFiles(r *podRun) error {
	end := r.ph.start(metrics.PhasePodFiles)
	err := podFiles(s.podDir(r.id), r.hostname, r.st.IP, r.cfg, r.hostNet, r.mountLabel)
	end()
	if err != nil {
		return fmt.Errorf("prepare files of pod %s: %w", r.id, err)
	}
	return nil
}

// newRunPod is the pod as the service keeps it, its config encoded for the store.
func newRunPod(r *podRun) (*pod, error) {
	raw, err := protojson.Marshal(r.cfg)
	if err != nil {
		return nil, fmt.Errorf("encode pod config: %w", err)
	}
	return &pod{
		rec: podRecord{ID: r.id, Handler: r.handler, CreatedAt: r.st.CreatedAt.UnixNano(), Config: raw,
			ProcessLabel: r.processLabel, MountLabel: r.mountLabel},
		config:  r.cfg,
		nameKey: r.nameKey,
	}, nil
}

// nriRunPodSandbox tells NRI plugins of the pod; undone by nriRemoveFailedPod.
func (s *Service) nriRunPodSandbox(ctx context.Context, r *podRun, p *pod) (nri.Pod, error) {
	np := s.nriPod(p)
	np.CgroupsPath = r.spec.PauseCgroupsPath
	if err := s.nri.RunPodSandbox(ctx, np); err != nil {
		return nri.Pod{}, fmt.Errorf("NRI RunPodSandbox of pod %s: %w", r.id, err)
	}
	return np, nil
}

// nriRemoveFailedPod undoes nriRunPodSandbox, on its own deadline: ctx may be what failed.
func (s *Service) nriRemoveFailedPod(np nri.Pod) {
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.nri.RemovePodSandbox(cctx, np)
}

// listPod stores the pod's record and lists it; nothing fails after it, so it has no undo.
func (s *Service) listPod(p *pod) error {
	if err := s.store.Put(podBucket, p.rec.ID, p.rec); err != nil {
		return err
	}
	s.mu.Lock()
	s.pods[p.rec.ID] = p
	s.mu.Unlock()
	// As containerd does: the sandbox reports itself as a container (id = pod id),
	// created and started, for kubelet's evented PLEG.
	s.emitPodEvent(p, runtime.ContainerEventType_CONTAINER_CREATED_EVENT)
	s.emitPodEvent(p, runtime.ContainerEventType_CONTAINER_STARTED_EVENT)
	return nil
}

// podRunDone records the pod's start latency and phases and logs it ready.
func (s *Service) podRunDone(r *podRun, begin time.Time) {
	s.metrics.ObservePodStart(time.Since(begin))
	r.ph.observe(s.metrics.ObservePodStartPhase)
	r.log.Info("pod sandbox ready", "ip", r.st.IP, "duration", time.Since(r.start))
}

// podSELinuxLabels allocates the pod's SELinux labels from its seLinuxOptions; undone
// by s.labels.release. Without SELinux labelling they are "", and options the pod
// sets are ignored with a warning, as containerd ignores them.
func (s *Service) podSELinuxLabels(r *podRun) (process, mount string, err error) {
	opts := r.cfg.GetLinux().GetSecurityContext().GetSelinuxOptions()
	process, mount, err = s.labels.podLabels(opts)
	if err != nil {
		return "", "", fmt.Errorf("SELinux labels of pod %s: %w", r.id, err)
	}
	if process == "" && (opts.GetUser() != "" || opts.GetRole() != "" || opts.GetType() != "" || opts.GetLevel() != "") {
		r.log.Warn("pod seLinuxOptions ignored: SELinux labelling is off on this node (enable_selinux, or the host has no SELinux)")
	}
	return process, mount, nil
}

// pauseLabel is the pause process's label: the pod's, or none for a privileged pod,
// whose pause keeps the shim's domain as containerd's does (its label stays recorded
// so that the level is freed with the pod).
func pauseLabel(r *podRun) string {
	if r.cfg.GetLinux().GetSecurityContext().GetPrivileged() {
		return ""
	}
	return r.processLabel
}
