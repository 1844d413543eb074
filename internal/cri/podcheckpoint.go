package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
)

// A pod checkpoint is a directory: podManifest names the pod checkpoint's files, and
// every container is one CheckpointContainer archive beside it, named by its index (a
// container name is the caller's and never becomes a path).
const (
	podManifest        = "pod.json"
	podManifestVersion = 1
)

// resumeTimeout bounds resuming the paused containers after a pod checkpoint; it runs
// on its own context, since the call's may be past its deadline by then.
const resumeTimeout = 30 * time.Second

// podCheckpoint is pod.json of a pod checkpoint.
type podCheckpoint struct {
	Version        int       `json:"version"`
	PodID          string    `json:"podId"`
	Handler        string    `json:"runtimeHandler"`
	CheckpointedAt time.Time `json:"checkpointedTime"`
	// Config is the pod's PodSandboxConfig (protojson), for reference: RestorePod
	// takes the config from its request.
	Config     json.RawMessage          `json:"config"`
	Containers []podCheckpointContainer `json:"containers"`
}

type podCheckpointContainer struct {
	Name    string `json:"name"`
	ID      string `json:"id"`
	Archive string `json:"archive"` // a file name in the checkpoint directory
}

// CheckpointPod checkpoints the selected running containers of a running pod into
// output_path (an existing empty directory): it pauses all of them before it dumps
// any, captures each (CRIU images, metadata, writable layer changes) and resumes all
// before it returns, on success, error or deadline. Only then are the archives
// written. A failure removes what the call wrote; nothing is written outside
// output_path.
func (s *Service) CheckpointPod(ctx context.Context, req *runtime.CheckpointPodRequest) (_ *runtime.CheckpointPodResponse, retErr error) {
	defer func() { retErr = toStatus(retErr) }()
	start := time.Now()
	if err := noOptions(req.GetOptions()); err != nil {
		return nil, err
	}
	p, err := s.resolvePod(req.GetPodSandboxId())
	if err != nil {
		return nil, err
	}
	if st, err := s.ctrl.Status(p.rec.ID); err != nil || st.State != controller.StateReady {
		return nil, fmt.Errorf("pod sandbox %s is not ready: only a running pod can be checkpointed: %w", p.rec.ID, errdefs.ErrFailedPrecondition)
	}
	out, err := emptyOutputDir(req.GetOutputPath())
	if err != nil {
		return nil, err
	}
	ctrs, err := s.selectPodContainers(p.rec.ID, req.GetContainerIds())
	if err != nil {
		return nil, err
	}
	log := s.log.With("pod", p.rec.ID, "output_path", out)

	// Lock in id order: two pod checkpoints of overlapping sets cannot deadlock.
	for _, c := range ctrs {
		c.op.Lock()
		defer c.op.Unlock()
	}
	recs := make([]containerRecord, len(ctrs))
	for i, c := range ctrs {
		recs[i] = c.snapshot()
		if recs[i].State != stateRunning {
			return nil, fmt.Errorf("container %s of pod %s is %s: only running containers can be checkpointed: %w", recs[i].ID, p.rec.ID, recs[i].State, errdefs.ErrFailedPrecondition)
		}
	}

	// Everything the call creates in out, removed if it fails.
	var created []string
	defer func() {
		if retErr != nil {
			for _, f := range created {
				if err := os.RemoveAll(f); err != nil {
					log.Warn("remove partial pod checkpoint", "path", f, "error", err)
				}
			}
		}
	}()
	stagings := make([]string, len(ctrs))
	for i := range ctrs {
		stagings[i] = filepath.Join(out, ".staging-"+strconv.Itoa(i))
		if err := os.Mkdir(stagings[i], 0o700); err != nil {
			return nil, fmt.Errorf("checkpoint pod %s: %w", p.rec.ID, err)
		}
		created = append(created, stagings[i])
	}

	// One cut: every container paused before the first dump, all resumed whatever
	// happens (CRIU leaves a container it found frozen frozen).
	frozen := time.Now()
	captures, err := s.capturePaused(ctx, p.rec.ID, ctrs, recs, stagings)
	paused := time.Since(frozen)
	if err != nil {
		return nil, fmt.Errorf("checkpoint pod %s: %w", p.rec.ID, err)
	}

	// The archives and the manifest, written from the staging dirs after the resume.
	manifest := podCheckpoint{Version: podManifestVersion, PodID: p.rec.ID, Handler: p.rec.Handler, CheckpointedAt: frozen.UTC(), Config: p.rec.Config}
	var total int64
	for i, c := range ctrs {
		name := "container-" + strconv.Itoa(i) + ".tar"
		created = append(created, filepath.Join(out, name))
		n, err := writeArchive(ctx, stagings[i], filepath.Join(out, name))
		if err != nil {
			return nil, fmt.Errorf("checkpoint container %s of pod %s: %w", recs[i].ID, p.rec.ID, err)
		}
		total += n
		if err := os.RemoveAll(stagings[i]); err != nil {
			return nil, fmt.Errorf("checkpoint pod %s: %w", p.rec.ID, err)
		}
		manifest.Containers = append(manifest.Containers, podCheckpointContainer{Name: c.config.GetMetadata().GetName(), ID: recs[i].ID, Archive: name})
	}
	data, err := json.MarshalIndent(manifest, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", podManifest, err)
	}
	created = append(created, filepath.Join(out, podManifest))
	if err := writeFileSync(filepath.Join(out, podManifest), data); err != nil {
		return nil, fmt.Errorf("checkpoint pod %s: %w", p.rec.ID, err)
	}
	var criu time.Duration
	for _, c := range captures {
		criu += c.criu
	}
	log.Info("pod checkpointed", "containers", len(ctrs), "archive_bytes", total, "paused", paused, "criu", criu, "duration", time.Since(start))
	return &runtime.CheckpointPodResponse{}, nil
}

// capturePaused pauses every container, captures each into its staging dir, and
// resumes all of them before it returns, on a context of its own: the call's may be
// past its deadline, and the runtime must never leave a pod frozen.
func (s *Service) capturePaused(ctx context.Context, podID string, ctrs []*container, recs []containerRecord, stagings []string) (_ []capture, retErr error) {
	var paused []string
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resumeTimeout)
		defer cancel()
		for _, id := range paused {
			if err := s.ctrl.ResumeContainer(rctx, podID, id); err != nil {
				s.log.Error("resume container after pod checkpoint", "pod", podID, "container", id, "error", err)
				retErr = errors.Join(retErr, err)
			}
		}
	}()
	for _, r := range recs {
		if err := s.ctrl.PauseContainer(ctx, podID, r.ID); err != nil {
			return nil, err
		}
		paused = append(paused, r.ID)
	}
	out := make([]capture, len(ctrs))
	for i, c := range ctrs {
		cp, err := s.captureContainer(ctx, c, recs[i], stagings[i])
		if err != nil {
			return nil, err
		}
		out[i] = cp
	}
	return out, nil
}

// noOptions refuses any runtime-specific option: crisp documents none, and the CRI
// says unknown keys are an error, never ignored.
func noOptions(opts map[string]string) error {
	if len(opts) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(opts))
	return invalid("unsupported options %q: crisp's pod checkpoint and restore take no options", keys)
}

// emptyOutputDir checks CheckpointPod's output_path: an absolute path of an existing
// directory (not a symlink, so that nothing is written elsewhere) that is empty.
func emptyOutputDir(path string) (string, error) {
	if path == "" {
		return "", invalid("output_path is required: an existing empty directory for the checkpoint")
	}
	if !filepath.IsAbs(path) {
		return "", invalid("output_path %q must be an absolute path", path)
	}
	path = filepath.Clean(path)
	fi, err := os.Lstat(path)
	if err != nil {
		return "", invalid("output_path %q: %v: create the directory first", path, err)
	}
	if !fi.IsDir() {
		return "", invalid("output_path %q is not a directory (a symlink is not followed)", path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return "", fmt.Errorf("read output_path %q: %w", path, err)
	}
	if len(entries) > 0 {
		return "", fmt.Errorf("output_path %q is not empty (%d entries, e.g. %q): give an empty directory: %w",
			path, len(entries), entries[0].Name(), errdefs.ErrFailedPrecondition)
	}
	return path, nil
}

// selectPodContainers resolves CheckpointPod's container ids: a non-empty list without
// duplicates of containers of podID, in id order. Unknown ids are NotFound, those of
// another pod InvalidArgument.
func (s *Service) selectPodContainers(podID string, ids []string) ([]*container, error) {
	if len(ids) == 0 {
		return nil, invalid("container_ids is empty: name the running containers of pod %s to checkpoint", podID)
	}
	seen := map[string]bool{}
	var out []*container
	for _, id := range ids {
		c, err := s.resolveContainer(id)
		if err != nil {
			return nil, err
		}
		rec := c.snapshot()
		if seen[rec.ID] {
			return nil, invalid("container %s is listed twice in container_ids", rec.ID)
		}
		seen[rec.ID] = true
		if rec.PodID != podID {
			return nil, invalid("container %s belongs to pod %s, not to pod %s", rec.ID, rec.PodID, podID)
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rec.ID < out[j].rec.ID })
	return out, nil
}

// RestorePod creates a pod from the request's config and, in it, the containers of a
// CheckpointPod directory, in the CREATED state: StartContainer restores each one's
// processes. Every container of the checkpoint needs exactly one config, matched by
// name; what the checkpoint fixes (image, command, args, working directory,
// environment, tty, user) must agree with it. A failure removes the pod and every
// container the call created.
func (s *Service) RestorePod(ctx context.Context, req *runtime.RestorePodRequest) (_ *runtime.RestorePodResponse, retErr error) {
	defer func() { retErr = toStatus(retErr) }()
	start := time.Now()
	if err := noOptions(req.GetOptions()); err != nil {
		return nil, err
	}
	dir, manifest, err := readPodCheckpoint(req.GetCheckpointPath())
	if err != nil {
		return nil, err
	}
	handler := req.GetRuntimeHandler()
	if handler == "" {
		handler = s.cfg.DefaultRuntimeHandler
	}
	if !s.ctrl.HasHandler(handler) {
		return nil, invalid("runtime handler %q is not configured", handler)
	}
	if manifest.Handler != "" && manifest.Handler != handler {
		return nil, invalid("checkpoint %q was made by runtime handler %q, not %q: restore it with that handler", dir, manifest.Handler, handler)
	}
	cfgs, err := matchContainerConfigs(dir, manifest, req.GetContainerConfigs())
	if err != nil {
		return nil, err
	}

	// Every archive is unpacked and checked before anything is created.
	sources := make([]*restoreSource, len(manifest.Containers))
	defer func() {
		for _, r := range sources {
			if r != nil {
				r.close()
			}
		}
	}()
	for i, mc := range manifest.Containers {
		if sources[i], err = s.openCheckpoint(ctx, filepath.Join(dir, mc.Archive)); err != nil {
			return nil, fmt.Errorf("container %q of checkpoint %q: %w", mc.Name, dir, err)
		}
		if err := s.checkRestoreConfig(sources[i], cfgs[i]); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("restore pod from %q: %w", dir, err)
	}

	// The pod, removed with whatever was created in it if a later step fails.
	resp, err := s.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: req.GetConfig(), RuntimeHandler: handler})
	if err != nil {
		return nil, err
	}
	podID := resp.GetPodSandboxId()
	defer func() {
		if retErr != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
			defer cancel()
			if _, err := s.RemovePodSandbox(rctx, &runtime.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
				s.log.Error("remove pod after failed restore", "pod", podID, "error", err)
			}
		}
	}()
	p, err := s.resolvePod(podID)
	if err != nil {
		return nil, err
	}
	st, err := s.ctrl.Status(podID)
	if err != nil {
		return nil, err
	}
	out := &runtime.RestorePodResponse{PodSandboxId: podID}
	for i, r := range sources {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("restore pod from %q: %w", dir, err)
		}
		id, err := s.createContainer(ctx, p, st, r.configFor(cfgs[i]), r)
		if err != nil {
			return nil, fmt.Errorf("restore container %q of checkpoint %q: %w", manifest.Containers[i].Name, dir, err)
		}
		out.RestoredContainers = append(out.RestoredContainers, &runtime.RestoredContainer{Name: manifest.Containers[i].Name, ContainerId: id})
	}
	// The response lists the containers in the request's order.
	order := map[string]int{}
	for i, c := range req.GetContainerConfigs() {
		order[c.GetMetadata().GetName()] = i
	}
	sort.Slice(out.RestoredContainers, func(i, j int) bool {
		return order[out.RestoredContainers[i].Name] < order[out.RestoredContainers[j].Name]
	})
	s.log.Info("pod restored", "pod", podID, "checkpoint", dir, "containers", len(sources), "duration", time.Since(start))
	return out, nil
}

// readPodCheckpoint validates RestorePod's checkpoint_path and reads its manifest.
func readPodCheckpoint(path string) (string, *podCheckpoint, error) {
	if path == "" {
		return "", nil, invalid("checkpoint_path is required: the directory CheckpointPod wrote")
	}
	if !filepath.IsAbs(path) {
		return "", nil, invalid("checkpoint_path %q must be an absolute path", path)
	}
	dir := filepath.Clean(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", nil, invalid("checkpoint_path %q is not a directory", dir)
	}
	var m podCheckpoint
	if err := readJSONFile(filepath.Join(dir, podManifest), &m); err != nil {
		return "", nil, invalid("%q is not a pod checkpoint of crisp: %v", dir, err)
	}
	if m.Version != podManifestVersion {
		return "", nil, invalid("pod checkpoint %q has version %d; this crisp reads version %d", dir, m.Version, podManifestVersion)
	}
	if len(m.Containers) == 0 {
		return "", nil, invalid("pod checkpoint %q holds no containers", dir)
	}
	for _, c := range m.Containers {
		// Archive names are written by CheckpointPod as bare file names; anything
		// else would read outside the checkpoint.
		if c.Name == "" || c.Archive == "" || c.Archive != filepath.Base(c.Archive) || c.Archive == "." || c.Archive == ".." {
			return "", nil, invalid("pod checkpoint %q: bad container entry %+v in %s", dir, c, podManifest)
		}
	}
	return dir, &m, nil
}

// matchContainerConfigs pairs the checkpoint's containers with the request's configs
// by metadata name: the names must be non-empty, unique and exactly the checkpoint's.
func matchContainerConfigs(dir string, m *podCheckpoint, cfgs []*runtime.ContainerConfig) ([]*runtime.ContainerConfig, error) {
	if len(cfgs) == 0 {
		return nil, invalid("container_configs is empty: give one config for every container of checkpoint %q", dir)
	}
	byName := map[string]*runtime.ContainerConfig{}
	for _, c := range cfgs {
		name := c.GetMetadata().GetName()
		if name == "" {
			return nil, invalid("a container config has no metadata.name")
		}
		if byName[name] != nil {
			return nil, invalid("container name %q is given twice in container_configs", name)
		}
		byName[name] = c
	}
	var want []string
	out := make([]*runtime.ContainerConfig, len(m.Containers))
	for i, mc := range m.Containers {
		want = append(want, mc.Name)
		out[i] = byName[mc.Name]
	}
	got := slices.Sorted(maps.Keys(byName))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return nil, invalid("container_configs name %q; checkpoint %q holds exactly %q", got, dir, want)
	}
	return out, nil
}

// checkRestoreConfig fails a restore-time config that contradicts the checkpointed
// process: the config describes it and cannot change it. Fields left empty are not
// compared; an archive of another runtime carries no CRI config, so only the image is.
func (s *Service) checkRestoreConfig(r *restoreSource, cfg *runtime.ContainerConfig) error {
	name := cfg.GetMetadata().GetName()
	if ref := cfg.GetImage().GetImage(); ref != "" {
		img, err := s.images.Get(ref)
		if err != nil {
			return fmt.Errorf("image %q of container %q: %w", ref, name, err)
		}
		if img.ID != r.image.ID {
			return invalid("container %q: image %q is %s, but the checkpoint was made from %q (%s)", name, ref, img.ID, r.imageName, r.image.ID)
		}
	}
	o := r.orig
	if o == nil {
		return nil
	}
	mismatch := func(field string, got, want any) error {
		return invalid("container %q: %s %v differs from the checkpointed process's %v: a restore cannot change it", name, field, got, want)
	}
	if len(cfg.GetCommand()) > 0 && !slices.Equal(cfg.GetCommand(), o.GetCommand()) {
		return mismatch("command", cfg.GetCommand(), o.GetCommand())
	}
	if len(cfg.GetArgs()) > 0 && !slices.Equal(cfg.GetArgs(), o.GetArgs()) {
		return mismatch("args", cfg.GetArgs(), o.GetArgs())
	}
	if w := cfg.GetWorkingDir(); w != "" && w != o.GetWorkingDir() {
		return mismatch("working_dir", w, o.GetWorkingDir())
	}
	if len(cfg.GetEnvs()) > 0 && !maps.Equal(envMap(cfg.GetEnvs()), envMap(o.GetEnvs())) {
		return mismatch("envs", envMap(cfg.GetEnvs()), envMap(o.GetEnvs()))
	}
	if cfg.GetTty() != o.GetTty() {
		return mismatch("tty", cfg.GetTty(), o.GetTty())
	}
	if u := cfg.GetLinux().GetSecurityContext().GetRunAsUser(); u != nil && u.GetValue() != o.GetLinux().GetSecurityContext().GetRunAsUser().GetValue() {
		return mismatch("run_as_user", u.GetValue(), o.GetLinux().GetSecurityContext().GetRunAsUser().GetValue())
	}
	return nil
}

func envMap(kvs []*runtime.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = string(kv.GetValue())
	}
	return m
}

// writeFileSync writes a new file (never over an existing one) and syncs it.
func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
