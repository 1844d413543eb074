package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/cri/spec"
	"github.com/crisp-runtime/crisp/internal/image"
	"github.com/crisp-runtime/crisp/internal/image/remote"
	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/internal/mount"
	"github.com/crisp-runtime/crisp/internal/nri"
	"github.com/crisp-runtime/crisp/internal/tracing"
)

// containerBucket holds the CRI's record of each container.
const containerBucket = "containers"

// Container states as the record keeps them.
const (
	stateCreated = "created"
	stateRunning = "running"
	stateExited  = "exited"
)

// containerRecord is what the store keeps of a container.
type containerRecord struct {
	ID         string          `json:"id"`
	PodID      string          `json:"pod_id"`
	Config     json.RawMessage `json:"config"`
	ImageID    string          `json:"image_id"`
	ImageRef   string          `json:"image_ref"`
	LogPath    string          `json:"log_path,omitempty"`
	State      string          `json:"state"`
	CreatedAt  int64           `json:"created_at"`
	StartedAt  int64           `json:"started_at,omitempty"`
	FinishedAt int64           `json:"finished_at,omitempty"`
	ExitCode   int32           `json:"exit_code"`
	Reason     string          `json:"reason,omitempty"`
	Message    string          `json:"message,omitempty"`
	Pid        uint32          `json:"pid,omitempty"`
	User       spec.UserInfo   `json:"user"`
	StopSignal int             `json:"stop_signal"`
	Resources  json.RawMessage `json:"resources,omitempty"`
	// ProcessLabel is the SELinux label the container's level was reserved with (kept
	// for a privileged container too, whose process runs without it): released with
	// the record, reserved again at recovery.
	ProcessLabel string `json:"process_label,omitempty"`
}

// container is the CRI's live view of one container.
type container struct {
	// op serialises lifecycle calls on one container. It is held across a stop's
	// grace period: nothing that sends NRI events that plugins may answer with
	// updates or evictions of other containers runs under it (see nriRuntime).
	op sync.Mutex
	// res serialises changes to the container's resources (UpdateContainerResources
	// and NRI plugins' updates) with the removal of its record. It is held only for
	// the shim's update and the record's write, never while waiting for an exit, so
	// a plugin's update of a container being stopped does not wait for its grace
	// period. Lock order: op before res.
	res sync.Mutex
	// removed is set, under res, once the record is deleted: later updates fail.
	removed bool

	mu      sync.Mutex
	rec     containerRecord
	config  *runtime.ContainerConfig
	nameKey string
	// exited is closed, once (markExited), when the container is known to run no more:
	// its monitor saw the exit, its start failed, or its record says so at recovery.
	// A created container's stays open across a restart until it is started.
	exited   chan struct{}
	exitOnce sync.Once
	// monitored is set by the first monitor call: one exit monitor per container,
	// whatever the order of recovery, StartContainer and exits.
	monitored bool
	cancel    context.CancelFunc
	entry     listed[*runtime.Container] // the list entry, built by listEntry
}

func newContainer(rec containerRecord, cfg *runtime.ContainerConfig, nameKey string) *container {
	return &container{rec: rec, config: cfg, nameKey: nameKey, exited: make(chan struct{})}
}

// markExited closes exited; every path that learns of the end of the container calls
// it, and only the first closes.
func (c *container) markExited() { c.exitOnce.Do(func() { close(c.exited) }) }

func (c *container) snapshot() containerRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec
}

// listEntry returns the container's ListContainers entry, built again only when its
// state changed: every other field is fixed at creation, and kubelet lists all
// containers every second. Concurrent responses share it; it must not be modified.
func (c *container) listEntry() listed[*runtime.Container] {
	c.mu.Lock()
	defer c.mu.Unlock()
	state := criState(c.rec.State)
	if c.entry.entry == nil || c.entry.entry.State != state {
		c.entry = newListed(&runtime.Container{
			Id: c.rec.ID, PodSandboxId: c.rec.PodID, Metadata: c.config.GetMetadata(),
			Image:    &runtime.ImageSpec{Image: c.rec.ImageID, UserSpecifiedImage: userImage(c.config.GetImage())},
			ImageRef: c.rec.ImageRef, ImageId: c.rec.ImageID, State: state, CreatedAt: c.rec.CreatedAt,
			Labels: c.config.GetLabels(), Annotations: c.config.GetAnnotations(),
		}, &runtime.Container{})
	}
	return c.entry
}

func containerName(md *runtime.ContainerMetadata, pod *runtime.PodSandboxMetadata) string {
	return strings.Join([]string{md.GetName(), pod.GetName(), pod.GetNamespace(), pod.GetUid(), fmt.Sprint(md.GetAttempt())}, "_")
}

// CreateContainer creates a container in a ready pod: a writable snapshot of the
// image, the OCI spec, and the container in the pod's shim; each step undone if a
// later one fails.
func (s *Service) CreateContainer(ctx context.Context, req *runtime.CreateContainerRequest) (_ *runtime.CreateContainerResponse, retErr error) {
	defer func() { retErr = toStatus(retErr) }()
	start := time.Now()
	cfg := req.GetConfig()
	if cfg == nil || cfg.GetMetadata().GetName() == "" {
		return nil, invalid("container config with metadata.name is required")
	}
	if cfg.GetImage().GetImage() == "" {
		return nil, invalid("container config has no image")
	}
	p, err := s.resolvePod(req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	st, err := s.ctrl.Status(p.rec.ID)
	if err != nil || st.State != controller.StateReady {
		return nil, fmt.Errorf("pod sandbox %s is not ready: %w", p.rec.ID, errdefs.ErrFailedPrecondition)
	}
	// A checkpoint archive as the image: the container is restored from it by Start.
	var restore *restoreSource
	if isCheckpointImage(cfg.GetImage().GetImage()) {
		if restore, err = s.openCheckpoint(ctx, cfg.GetImage().GetImage()); err != nil {
			return nil, err
		}
		defer restore.close()
		cfg = restore.configFor(cfg)
	}
	id, err := s.createContainer(ctx, p, st, cfg, restore)
	if err != nil {
		return nil, err
	}
	s.metrics.ObserveContainerCreate(time.Since(start))
	return &runtime.CreateContainerResponse{ContainerId: id}, nil
}

// createContainer creates a container from cfg in the ready pod p (st is its status):
// the rootfs, the spec, the container in the shim and the record; with restore, one
// restored from that checkpoint by StartContainer. CreateContainer and RestorePod
// create through here; a failure undoes every step.
func (s *Service) createContainer(ctx context.Context, p *pod, st *controller.Status, cfg *runtime.ContainerConfig, restore *restoreSource) (_ string, retErr error) {
	img, err := s.images.Get(cfg.GetImage().GetImage())
	if errdefs.IsNotFound(err) {
		return "", fmt.Errorf("image %q is not present: pull it first: %w", cfg.GetImage().GetImage(), errdefs.ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	imgSpec, err := img.Spec()
	if err != nil {
		return "", err
	}
	id := newID()
	log := s.log.With("container", id, "name", cfg.GetMetadata().GetName(), "pod", p.rec.ID)
	ph := phases{}

	// 1. The name.
	nameKey := containerName(cfg.GetMetadata(), p.config.GetMetadata())
	if err := s.ctrNames.reserve(nameKey, id); err != nil {
		return "", err
	}
	defer func() {
		if retErr != nil {
			s.ctrNames.release(nameKey, id)
		}
	}()

	// 1b. The SELinux labels: the pod's level unless the container sets its own.
	processLabel, mountLabel, err := s.labels.containerLabels(p.rec.ProcessLabel, cfg.GetLinux().GetSecurityContext().GetSelinuxOptions())
	if err != nil {
		return "", fmt.Errorf("SELinux labels of container %s: %w", id, err)
	}
	defer func() {
		if retErr != nil {
			s.labels.release(processLabel)
		}
	}()

	// 2. The writable rootfs.
	end := ph.start(metrics.CreatePhaseSnapshot)
	_, span := tracing.Start(ctx, "cri.container.rootfs", tracing.AttrContainerID.String(id))
	snapMounts, err := s.images.PrepareRootfs(id, img)
	tracing.End(span, err)
	end()
	if err != nil {
		return "", fmt.Errorf("prepare rootfs of container %s: %w", id, err)
	}
	defer func() {
		if retErr != nil {
			if err := s.images.RemoveRootfs(id); err != nil {
				log.Warn("remove rootfs after failed create", "err", err)
			}
		}
	}()
	var rootfs []mount.Mount
	for _, m := range snapMounts {
		rootfs = append(rootfs, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	if restore != nil {
		if err := restore.applyRootfs(ctx, s.images, id); err != nil {
			return "", err
		}
	}

	// 2b. Image volumes: each image a mount names, mounted read-only for the spec to
	// bind (specCfg); cfg keeps the mounts as asked, for the record and the status.
	specCfg, err := s.mountImageVolumes(id, cfg, mountLabel)
	if err != nil {
		return "", err
	}
	defer func() {
		if retErr != nil {
			if err := s.unmountImageVolumes(id); err != nil {
				log.Warn("unmount image volumes after failed create", "err", err)
			}
		}
	}()

	// 3. The spec, with users resolved in the image's own /etc files.
	stopSig, err := spec.StopSignal(cfg, imgSpec)
	if err != nil {
		return "", err
	}
	_, span = tracing.Start(ctx, "cri.container.spec", tracing.AttrContainerID.String(id))
	res, err := s.generateSpec(id, specCfg, p, img, imgSpec, st, rootfs, ph, processLabel, mountLabel)
	tracing.End(span, err)
	if err != nil {
		return "", err
	}
	// 3a. Volumes kubelet asks to relabel get the container's file label.
	if err := relabelMounts(res.Relabel, mountLabel); err != nil {
		return "", err
	}
	for _, w := range res.Warnings {
		log.Warn("container spec", "warning", w)
	}

	// 3b. NRI plugins adjust the spec before it is final, as in containerd. They may
	// not synchronize until the container is listed (or its create has failed).
	defer s.nri.BlockSync().Unblock()
	nriResources, err := s.adjustWithNRI(ctx, p, id, cfg, res.Spec)
	if s.nri.Enabled() {
		defer func() {
			if retErr != nil {
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				s.nri.UndoCreateContainer(cctx, s.nriPod(p), newNRIContainer(p, id, cfg, res.Spec))
			}
		}()
	}
	if err != nil {
		return "", err
	}

	// 4. The container in the pod's shim.
	logPath := ""
	if dir, lp := p.config.GetLogDirectory(), cfg.GetLogPath(); dir != "" && lp != "" {
		logPath = filepath.Join(dir, lp)
	}
	end = ph.start(metrics.CreatePhaseTaskCreate)
	_, err = s.ctrl.CreateContainer(ctx, controller.ContainerSpec{
		ID: id, SandboxID: p.rec.ID, Spec: res.Spec, Rootfs: withMountLabel(rootfs, mountLabel), LogPath: logPath, Terminal: cfg.GetTty(), Stdin: cfg.GetStdin(),
		Checkpoint: restore.imagesDir(),
	})
	end()
	if err != nil {
		return "", err
	}
	defer func() {
		if retErr != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.ctrl.DeleteContainer(cctx, p.rec.ID, id); err != nil {
				log.Warn("delete container after failed create", "err", err)
			}
		}
	}()

	// 5. The record.
	raw, err := protojson.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("encode container config: %w", err)
	}
	// image_id is the config digest whatever name the image was asked for by; image_ref
	// is the repo digest of the repository the user named (kubelet passes the image ID
	// in image and the pod spec's name in user_specified_image), as containerd reports.
	imageRef := img.RepoDigest(userImage(cfg.GetImage()))
	c := newContainer(containerRecord{
		ID: id, PodID: p.rec.ID, Config: raw, ImageID: img.ID, ImageRef: imageRef, LogPath: logPath,
		State: stateCreated, CreatedAt: time.Now().UnixNano(), User: res.User, StopSignal: int(stopSig),
		Resources: nriResources, ProcessLabel: processLabel,
	}, cfg, nameKey)
	if err := s.store.Put(containerBucket, id, c.rec); err != nil {
		return "", err
	}
	s.mu.Lock()
	s.containers[id] = c
	s.mu.Unlock()
	s.emitContainerEvent(id, p.rec.ID, runtime.ContainerEventType_CONTAINER_CREATED_EVENT)
	if s.nri.Enabled() {
		s.nri.PostCreateContainer(ctx, s.nriPod(p), nriContainer(c, res.Spec))
	}
	ph.observe(s.metrics.ObserveContainerCreatePhase)
	return id, nil
}

// userImage is the image as the user named it: the CRI's user_specified_image, or
// the image field when the caller (crictl, an older kubelet) sets only that.
func userImage(spec *runtime.ImageSpec) string {
	if u := spec.GetUserSpecifiedImage(); u != "" {
		return u
	}
	return spec.GetImage()
}

// imageTag is what ContainerStatus reports as the image, as containerd and dockershim
// do: a tag of the image (kubelet shows it as the container's image), the one the
// container was created with when that is still a tag of it, else its first; the image
// id when it has no tag (left, or pulled by digest only).
func (s *Service) imageTag(imageID, userImage string) string {
	img, err := s.images.Get(imageID)
	if err != nil || len(img.RepoTags) == 0 {
		return imageID
	}
	if named, err := remote.Normalize(userImage); err == nil && slices.Contains(img.RepoTags, named.String()) {
		return named.String()
	}
	return img.RepoTags[0]
}

// generateSpec mounts the rootfs briefly so the spec can resolve users and groups
// from the image's own /etc/passwd and /etc/group; ph gets the mount and unmount as
// the user lookup and the generation as the spec.
func (s *Service) generateSpec(id string, cfg *runtime.ContainerConfig, p *pod, img *image.Image, imgSpec ocispec.Image, st *controller.Status, rootfs []mount.Mount, ph phases, processLabel, mountLabel string) (*spec.Result, error) {
	tmp, err := os.MkdirTemp(filepath.Join(s.cfg.StateDir), "rootfs-")
	if err != nil {
		return nil, fmt.Errorf("temp dir for rootfs: %w", err)
	}
	defer os.Remove(tmp)
	end := ph.start(metrics.CreatePhaseUser)
	err = mount.All(rootfs, tmp)
	end()
	if err != nil {
		return nil, fmt.Errorf("mount rootfs of image %s: %w", img.ID, err)
	}
	defer func() {
		defer ph.start(metrics.CreatePhaseUser)()
		if err := mount.Unmount(tmp); err != nil {
			s.log.Warn("unmount temporary rootfs", "dir", tmp, "err", err)
		}
	}()
	targetPid := 0
	if ns := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions(); ns.GetPid() == runtime.NamespaceMode_TARGET {
		t, err := s.resolveContainer(ns.GetTargetId())
		if err != nil {
			return nil, fmt.Errorf("target container of the pid namespace: %w", err)
		}
		rec := t.snapshot()
		if rec.State != stateRunning || rec.PodID != p.rec.ID {
			return nil, invalid("target container %s must be running in the same pod", rec.ID)
		}
		targetPid = int(rec.Pid)
	}
	defer ph.start(metrics.CreatePhaseSpec)()
	return spec.Generate(spec.Input{
		ContainerID:             id,
		SandboxID:               p.rec.ID,
		ImageName:               userImage(cfg.GetImage()),
		Config:                  cfg,
		Pod:                     p.config,
		Image:                   imgSpec,
		RootfsPath:              tmp,
		PausePid:                int(st.Pid),
		NetNSPath:               st.NetNS,
		PodFilesDir:             s.podDir(p.rec.ID),
		ShmPath:                 s.podShm(p),
		CgroupParent:            p.config.GetLinux().GetCgroupParent(),
		SystemdCgroup:           s.cfg.CgroupDriver == "systemd",
		TargetPid:               targetPid,
		OOMScoreAdjFloor:        ownOOMScoreAdj(),
		RecursiveReadOnlyMounts: s.handlerFeatures(p.rec.Handler).GetRecursiveReadOnlyMounts(),
		CDI:                     s.cdi,
		AppArmor:                s.apparmor,
		ProcessLabel:            processLabel,
		MountLabel:              mountLabel,
	})
}

// ownOOMScoreAdj is criserver's own oom_score_adj: without CAP_SYS_RESOURCE nothing
// may go lower, so container values are clamped to it.
func ownOOMScoreAdj() int {
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0
	}
	var v int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(data)), "%d", &v); err != nil {
		return 0
	}
	return v
}

// resolveContainer finds a container by full id or unique prefix.
func (s *Service) resolveContainer(id string) (*container, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return lookupPrefix(s.containers, id, "container")
}

// StartContainer starts a created container and watches it for its exit.
func (s *Service) StartContainer(ctx context.Context, req *runtime.StartContainerRequest) (*runtime.StartContainerResponse, error) {
	start := time.Now()
	c, err := s.resolveContainer(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	nriPod, nriStarted, err := s.startContainer(ctx, c)
	if err != nil {
		if nriStarted {
			// Outside c.op, as every NRI event plugins may answer with updates.
			s.nri.StopContainer(ctx, nriPod, nriContainer(c, nil))
		}
		return nil, toStatus(err)
	}
	if s.nri.Enabled() {
		s.nri.PostStartContainer(ctx, nriPod, nriContainer(c, nil))
	}
	s.metrics.ObserveContainerStart(time.Since(start))
	return &runtime.StartContainerResponse{}, nil
}

// startContainer is StartContainer under the container's lock. nriStarted reports
// whether plugins were told of the start, so must be told of its failure.
func (s *Service) startContainer(ctx context.Context, c *container) (nriPod nri.Pod, nriStarted bool, _ error) {
	c.op.Lock()
	defer c.op.Unlock()
	rec := c.snapshot()
	if rec.State != stateCreated {
		return nriPod, false, fmt.Errorf("container %s is %s, not created: it can be started only once: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	if rec.LogPath != "" {
		if err := os.MkdirAll(filepath.Dir(rec.LogPath), 0o755); err != nil {
			return nriPod, false, fmt.Errorf("create log dir of container %s: %w", rec.ID, err)
		}
	}
	if s.nri.Enabled() {
		// As in containerd: a plugin's error fails the start.
		nriPod = s.nriPodOf(rec.PodID)
		if err := s.nri.StartContainer(ctx, nriPod, nriContainer(c, nil)); err != nil {
			return nriPod, true, err
		}
	}
	pid, err := s.ctrl.StartContainer(ctx, rec.PodID, rec.ID)
	if err != nil {
		c.mu.Lock()
		c.rec.State, c.rec.FinishedAt, c.rec.ExitCode, c.rec.Reason, c.rec.Message = stateExited, time.Now().UnixNano(), 128, "StartError", err.Error()
		r := c.rec
		c.mu.Unlock()
		_ = s.store.Put(containerBucket, r.ID, r)
		c.markExited()
		// It will never run: kubelet must see it exited like any other stop.
		s.emitContainerEvent(r.ID, r.PodID, runtime.ContainerEventType_CONTAINER_STOPPED_EVENT)
		return nriPod, s.nri.Enabled(), err
	}
	c.mu.Lock()
	c.rec.State, c.rec.StartedAt, c.rec.Pid = stateRunning, time.Now().UnixNano(), pid
	r := c.rec
	c.mu.Unlock()
	if err := s.store.Put(containerBucket, r.ID, r); err != nil {
		return nriPod, false, err
	}
	// Before the monitor starts, so that STARTED always precedes STOPPED.
	s.emitContainerEvent(r.ID, r.PodID, runtime.ContainerEventType_CONTAINER_STARTED_EVENT)
	s.monitor(c)
	return nriPod, false, nil
}

// monitor waits in the background for the container's exit and records it. Only the
// first call starts one; removeContainer stops it.
func (s *Service) monitor(c *container) {
	ctx, cancel, rec, ok := s.claimMonitor(c)
	if !ok {
		return
	}
	s.monitors.Add(1)
	go func() {
		defer s.monitors.Done()
		defer cancel()
		s.awaitExit(ctx, c, rec)
	}()
}

// claimMonitor makes the caller c's one exit monitor: false when c has one already.
func (s *Service) claimMonitor(c *container) (context.Context, context.CancelFunc, containerRecord, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.monitored {
		return nil, nil, containerRecord{}, false
	}
	c.monitored = true
	ctx, cancel := context.WithCancel(s.bg)
	c.cancel = cancel
	return ctx, cancel, c.rec, true
}

// awaitExit waits for the container's exit and records it: the record first, then
// exited is closed, so that a RemoveContainer waiting for the exit deletes the record
// after this write and not before it (the record would come back).
func (s *Service) awaitExit(ctx context.Context, c *container, rec containerRecord) {
	st, err := s.ctrl.WaitContainer(ctx, rec.PodID, rec.ID)
	if ctx.Err() != nil {
		return
	}
	// The reason is settled before the exit is published: a ContainerStatus between
	// the two would otherwise report an OOM kill as "Error".
	oom := false
	if err == nil && !st.ShimDied {
		octx, ocancel := context.WithTimeout(context.Background(), 5*time.Second)
		killed, oerr := s.ctrl.OOMKilled(octx, rec.PodID, rec.ID)
		ocancel()
		oom = oerr == nil && killed
	}
	c.mu.Lock()
	if c.rec.State != stateRunning {
		c.mu.Unlock()
		return
	}
	c.exitRecord(st, err, oom)
	r := c.rec
	c.mu.Unlock()
	if err := s.store.Put(containerBucket, r.ID, r); err != nil {
		s.log.Error("record container exit", "container", r.ID, "err", err)
	}
	// Before exited is closed: RemoveContainer waits for it, so STOPPED always
	// precedes DELETED.
	s.emitContainerEvent(r.ID, r.PodID, runtime.ContainerEventType_CONTAINER_STOPPED_EVENT)
	if s.nri.Enabled() {
		// As containerd's exit handler: plugins see the stop of a container that ended
		// on its own, or was killed (once: the other reports are then no-ops). In the
		// background: plugins may answer with updates of sibling containers, and the
		// exit must not wait for those (StopContainer of a sibling holds its lock
		// while it waits for this exit). The stop is claimed now, so StopPodSandbox
		// and RemoveContainer still send their events after it.
		s.nri.NotifyContainerExit(s.nriPodOf(r.PodID), nriContainer(c, nil))
	}
	c.markExited()
	s.metrics.ContainerExited(r.Reason)
	s.log.Info("container exited", "container", r.ID, "exit_code", r.ExitCode, "reason", r.Reason)
}

// exitRecord fills in how the container ended from its monitor's wait: st and err
// from WaitContainer, oom from the shim. c.mu must be held.
func (c *container) exitRecord(st controller.ContainerState, err error, oom bool) {
	c.rec.State = stateExited
	switch {
	case err != nil:
		c.rec.FinishedAt, c.rec.ExitCode, c.rec.Reason = time.Now().UnixNano(), 255, "Unknown"
		c.rec.Message = fmt.Sprintf("lost the container: %v", err)
	case st.ShimDied:
		// As containerd reports a task whose shim died: killed, 137.
		c.rec.FinishedAt, c.rec.ExitCode, c.rec.Reason = st.ExitedAt.UnixNano(), int32(st.ExitStatus), "Error"
		c.rec.Message = "the pod's shim died; crisp killed every process of the pod"
	default:
		c.rec.FinishedAt, c.rec.ExitCode = st.ExitedAt.UnixNano(), int32(st.ExitStatus)
		switch {
		case oom:
			c.rec.Reason = "OOMKilled"
		case st.ExitStatus != 0:
			c.rec.Reason = "Error"
		default:
			c.rec.Reason = "Completed"
		}
	}
}

// StopContainer sends the stop signal, then SIGKILL after the timeout (0: at once).
// Stopping a container that is not running, or one crisp does not know, succeeds.
func (s *Service) StopContainer(ctx context.Context, req *runtime.StopContainerRequest) (*runtime.StopContainerResponse, error) {
	c, err := s.resolveContainer(req.GetContainerId())
	if errdefs.IsNotFound(err) {
		// Stopped and removed already, or never there: kubelet retries stops, and
		// containerd 2.x answers them OK too. Empty or ambiguous ids stay errors.
		return &runtime.StopContainerResponse{}, nil
	}
	if err != nil {
		return nil, toStatus(err)
	}
	c.op.Lock()
	err = s.stopContainer(ctx, c, criTimeout(req.GetTimeout()))
	c.op.Unlock()
	if err != nil {
		return nil, toStatus(err)
	}
	// Outside c.op: plugins may answer with updates of sibling containers.
	if s.nri.Enabled() {
		s.nri.StopContainer(ctx, s.nriPodOf(c.rec.PodID), nriContainer(c, nil))
	}
	return &runtime.StopContainerResponse{}, nil
}

func (s *Service) stopContainer(ctx context.Context, c *container, timeout time.Duration) error {
	rec := c.snapshot()
	if rec.State != stateRunning {
		return nil
	}
	if timeout > 0 {
		sig := syscall.Signal(rec.StopSignal)
		if sig == 0 {
			sig = syscall.SIGTERM
		}
		if err := s.ctrl.KillContainer(ctx, rec.PodID, rec.ID, sig, false); err != nil && !s.killGone(rec.PodID, err) {
			return err
		}
		select {
		case <-c.exited:
			return nil
		case <-time.After(timeout):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := s.ctrl.KillContainer(ctx, rec.PodID, rec.ID, syscall.SIGKILL, true); err != nil && !s.killGone(rec.PodID, err) {
		return err
	}
	select {
	case <-c.exited:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("container %s did not exit 30s after SIGKILL: %w", rec.ID, errdefs.ErrUnavailable)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// killGone reports whether a kill failed only because there is nothing left to kill:
// the shim does not know the container, or the pod's shim died (its exit is recorded
// once the controller has killed the pod, which the caller then waits for).
func (s *Service) killGone(podID string, err error) bool {
	if errdefs.IsNotFound(err) {
		return true
	}
	st, serr := s.ctrl.Status(podID)
	return serr == nil && !st.ShimAlive
}

// RemoveContainer kills the container if it runs and removes it with its writable
// layer. Unknown ids succeed.
func (s *Service) RemoveContainer(ctx context.Context, req *runtime.RemoveContainerRequest) (*runtime.RemoveContainerResponse, error) {
	c, err := s.resolveContainer(req.GetContainerId())
	if errdefs.IsNotFound(err) {
		return &runtime.RemoveContainerResponse{}, nil
	}
	if err != nil {
		return nil, toStatus(err)
	}
	if err := s.removeContainer(ctx, c); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.RemoveContainerResponse{}, nil
}

// removeContainer removes c, then tells NRI plugins, outside c.op.
func (s *Service) removeContainer(ctx context.Context, c *container) error {
	c.op.Lock()
	err := s.removeLocked(ctx, c)
	c.op.Unlock()
	if err != nil {
		return err
	}
	if s.nri.Enabled() {
		s.nri.RemoveContainer(ctx, s.nriPodOf(c.rec.PodID), nriContainer(c, nil))
	}
	return nil
}

// removeLocked stops and deletes c and its record; c.op must be held.
func (s *Service) removeLocked(ctx context.Context, c *container) error {
	if err := s.stopContainer(ctx, c, 0); err != nil {
		return fmt.Errorf("kill container before removal: %w", err)
	}
	rec := c.snapshot()
	c.mu.Lock()
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
	if err := s.ctrl.DeleteContainer(ctx, rec.PodID, rec.ID); err != nil {
		return err
	}
	if err := s.images.RemoveRootfs(rec.ID); err != nil {
		return fmt.Errorf("remove rootfs of container %s: %w", rec.ID, err)
	}
	// Before the record goes, so a failure leaves the container for a retry.
	if err := s.unmountImageVolumes(rec.ID); err != nil {
		return err
	}
	// Under res: an update in flight writes the record before it goes, or not at all.
	c.res.Lock()
	err := s.store.Delete(containerBucket, rec.ID)
	c.removed = err == nil
	c.res.Unlock()
	if err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.containers, rec.ID)
	s.mu.Unlock()
	s.labels.release(rec.ProcessLabel)
	s.ctrNames.release(c.nameKey, rec.ID)
	s.emitContainerEvent(rec.ID, rec.PodID, runtime.ContainerEventType_CONTAINER_DELETED_EVENT)
	return nil
}

// containersOf lists the containers of a pod.
func (s *Service) containersOf(podID string) []*container {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*container
	for _, c := range s.containers {
		if c.rec.PodID == podID {
			out = append(out, c)
		}
	}
	return out
}

// ContainerStatus reports a container's state, times, exit and config.
func (s *Service) ContainerStatus(_ context.Context, req *runtime.ContainerStatusRequest) (*runtime.ContainerStatusResponse, error) {
	c, err := s.resolveContainer(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	st, rec := s.containerStatus(c)
	resp := &runtime.ContainerStatusResponse{Status: st}
	if req.GetVerbose() {
		info := map[string]any{"sandboxID": rec.PodID, "pid": rec.Pid, "user": rec.User, "stopSignal": rec.StopSignal}
		if data, err := os.ReadFile(filepath.Join(s.cfg.StateDir, "containers", rec.ID, "config.json")); err == nil {
			info["runtimeSpec"] = json.RawMessage(data)
		}
		data, _ := json.Marshal(info)
		resp.Info = map[string]string{"info": string(data)}
	}
	return resp, nil
}

// containerStatus is a container's CRI status, as ContainerStatus, the container
// events and a checkpoint's status.dump report it, and the record it was built from.
// It must not be called with s.mu held.
func (s *Service) containerStatus(c *container) (*runtime.ContainerStatus, containerRecord) {
	rec := c.snapshot()
	cfg := c.config
	st := &runtime.ContainerStatus{
		Id:          rec.ID,
		Metadata:    cfg.GetMetadata(),
		State:       criState(rec.State),
		CreatedAt:   rec.CreatedAt,
		StartedAt:   rec.StartedAt,
		FinishedAt:  rec.FinishedAt,
		ExitCode:    rec.ExitCode,
		Image:       &runtime.ImageSpec{Image: rec.ImageID, UserSpecifiedImage: userImage(cfg.GetImage()), Annotations: cfg.GetImage().GetAnnotations()},
		ImageRef:    rec.ImageRef,
		ImageId:     rec.ImageID,
		Reason:      rec.Reason,
		Message:     rec.Message,
		Labels:      cfg.GetLabels(),
		Annotations: cfg.GetAnnotations(),
		Mounts:      cfg.GetMounts(),
		LogPath:     rec.LogPath,
		User: &runtime.ContainerUser{Linux: &runtime.LinuxContainerUser{
			Uid: int64(rec.User.UID), Gid: int64(rec.User.GID), SupplementalGroups: toInt64s(rec.User.AdditionalGIDs),
		}},
	}
	if res := currentResources(rec, cfg); res != nil {
		st.Resources = &runtime.ContainerResources{Linux: res}
	}
	st.Image.Image = s.imageTag(rec.ImageID, st.Image.GetUserSpecifiedImage())
	s.mu.RLock()
	p := s.pods[rec.PodID]
	s.mu.RUnlock()
	if p != nil {
		st.Mounts = idmappedMounts(st.Mounts, p.config)
	}
	return st, rec
}

// currentResources is what a container runs with: the resources of its last
// UpdateContainerResources (merged into those before it), else those of its config.
func currentResources(rec containerRecord, cfg *runtime.ContainerConfig) *runtime.LinuxContainerResources {
	if len(rec.Resources) > 0 {
		var r runtime.LinuxContainerResources
		if protojson.Unmarshal(rec.Resources, &r) == nil {
			return &r
		}
	}
	return cfg.GetLinux().GetResources()
}

func toInt64s(in []uint32) []int64 {
	out := make([]int64, 0, len(in))
	for _, v := range in {
		out = append(out, int64(v))
	}
	return out
}

func criState(s string) runtime.ContainerState {
	switch s {
	case stateCreated:
		return runtime.ContainerState_CONTAINER_CREATED
	case stateRunning:
		return runtime.ContainerState_CONTAINER_RUNNING
	case stateExited:
		return runtime.ContainerState_CONTAINER_EXITED
	}
	return runtime.ContainerState_CONTAINER_UNKNOWN
}

// ListContainers lists containers matching the filter: id or prefix, state, pod, labels.
func (s *Service) ListContainers(_ context.Context, req *runtime.ListContainersRequest) (*runtime.ListContainersResponse, error) {
	return &runtime.ListContainersResponse{Containers: wiresOf(s.listContainers(req.GetFilter()))}, nil
}

// containersWithPrefix returns the containers whose id starts with prefix (all for "").
func (s *Service) containersWithPrefix(prefix string) []*container {
	s.mu.RLock()
	defer s.mu.RUnlock()
	list := make([]*container, 0, len(s.containers))
	for id, c := range s.containers {
		if strings.HasPrefix(id, prefix) {
			list = append(list, c)
		}
	}
	return list
}

// listContainers is the one filter ListContainers and StreamContainers share, oldest
// container first.
func (s *Service) listContainers(f *runtime.ContainerFilter) []listed[*runtime.Container] {
	list := s.containersWithPrefix(f.GetId())
	out := make([]listed[*runtime.Container], 0, len(list))
	for _, c := range list {
		l := c.listEntry()
		e := l.entry
		if f.GetPodSandboxId() != "" && !strings.HasPrefix(e.PodSandboxId, f.GetPodSandboxId()) {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != e.State {
			continue
		}
		if !labelsMatch(e.Labels, f.GetLabelSelector()) {
			continue
		}
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].entry.CreatedAt < out[j].entry.CreatedAt })
	return out
}

// UpdateContainerResources applies new resources to a running container and keeps
// them for ContainerStatus.
func (s *Service) UpdateContainerResources(ctx context.Context, req *runtime.UpdateContainerResourcesRequest) (*runtime.UpdateContainerResourcesResponse, error) {
	c, err := s.resolveContainer(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	// The request is checked on its own, so that an error names what it sent.
	if _, err := spec.UpdateResources(req.GetLinux()); err != nil {
		return nil, toStatus(err)
	}
	linux := req.GetLinux()
	var nriPod nri.Pod
	if s.nri.Enabled() {
		// Before the container's lock, as containerd asks before its status update: a
		// plugin's answer may update or evict containers, this one too.
		nriPod = s.nriPodOf(c.rec.PodID)
		upd, err := s.nri.UpdateContainer(ctx, nriPod, nriContainer(c, nil), nri.FromCRIResources(linux))
		if err != nil {
			return nil, toStatus(err)
		}
		if upd != nil {
			linux = nri.ToCRIResources(upd, linux.GetOomScoreAdj())
		}
	}
	c.op.Lock()
	c.res.Lock()
	err = s.updateResources(ctx, c, linux)
	c.res.Unlock()
	c.op.Unlock()
	if err != nil {
		return nil, toStatus(err)
	}
	if s.nri.Enabled() {
		s.nri.PostUpdateContainer(ctx, nriPod, nriContainer(c, nil))
	}
	return &runtime.UpdateContainerResourcesResponse{}, nil
}

// updateResources applies an update of the container's resources (UpdateContainerResources,
// and NRI plugins' updates); c.res must be held.
func (s *Service) updateResources(ctx context.Context, c *container, linux *runtime.LinuxContainerResources) error {
	rec := c.snapshot()
	if c.removed {
		return fmt.Errorf("container %s was removed: %w", rec.ID, errdefs.ErrNotFound)
	}
	if rec.State != stateRunning && rec.State != stateCreated {
		return fmt.Errorf("container %s is %s: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	// What the container runs with after it: the update merged into what it had, as
	// containerd merges it into the spec. The shim, the bundle's spec and
	// ContainerStatus all get that whole, so none of them loses what the update left.
	merged := spec.MergeResources(currentResources(rec, c.config), linux)
	res, err := spec.UpdateResources(merged)
	if err != nil {
		return err
	}
	if err := s.ctrl.UpdateContainer(ctx, rec.PodID, rec.ID, res); err != nil {
		return err
	}
	raw, err := protojson.Marshal(merged)
	if err != nil {
		return fmt.Errorf("encode resources of container %s: %w", rec.ID, err)
	}
	c.mu.Lock()
	c.rec.Resources = raw
	r := c.rec
	c.mu.Unlock()
	return s.store.Put(containerBucket, r.ID, r)
}

// ReopenContainerLog has the shim reopen the log file kubelet just rotated.
func (s *Service) ReopenContainerLog(ctx context.Context, req *runtime.ReopenContainerLogRequest) (*runtime.ReopenContainerLogResponse, error) {
	c, err := s.resolveContainer(req.GetContainerId())
	if err != nil {
		return nil, toStatus(err)
	}
	rec := c.snapshot()
	if rec.State != stateRunning {
		return nil, toStatus(fmt.Errorf("container %s is not running: %w", rec.ID, errdefs.ErrFailedPrecondition))
	}
	if err := s.ctrl.ReopenContainerLog(ctx, rec.PodID, rec.ID); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ReopenContainerLogResponse{}, nil
}

// idmappedMounts reports the volumes of a container in a user-namespaced pod as
// internal/cri/spec mounts them: idmapped, with the volume's own mappings or else the pod's.
// The request's mounts are not modified.
func idmappedMounts(ms []*runtime.Mount, pod *runtime.PodSandboxConfig) []*runtime.Mount {
	u := pod.GetLinux().GetSecurityContext().GetNamespaceOptions().GetUsernsOptions()
	if u.GetMode() != runtime.NamespaceMode_POD || len(ms) == 0 {
		return ms
	}
	out := make([]*runtime.Mount, len(ms))
	for i, m := range ms {
		if len(m.GetUidMappings()) > 0 || len(m.GetGidMappings()) > 0 {
			out[i] = m
			continue
		}
		c := proto.Clone(m).(*runtime.Mount)
		c.UidMappings, c.GidMappings = u.GetUids(), u.GetGids()
		out[i] = c
	}
	return out
}

// phases times the parts of one operation for a breakdown metric. The durations are
// recorded only once the whole operation succeeded: the parts of a failed one (often
// cut short) would skew the breakdown of those that work.
type phases map[string]time.Duration

// start begins timing phase; the function it returns ends it. A phase timed more than
// once adds up.
func (ph phases) start(phase string) (end func()) {
	t := time.Now()
	return func() { ph[phase] += time.Since(t) }
}

// observe records every phase with record (a metrics Observe*Phase method).
func (ph phases) observe(record func(phase string, d time.Duration)) {
	for phase, d := range ph {
		record(phase, d)
	}
}
