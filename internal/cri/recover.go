package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/mount"
)

// Recover loads the pods and containers from the store after a restart and settles
// what a crash cut short, before anything is served:
//   - a sandbox the CRI has no record of (killed between the two writes of
//     RunPodSandbox) is removed;
//   - a pod record whose sandbox is gone (a RemovePodSandbox cut short) is removed;
//   - containers are settled by settleContainers;
//   - whatever no record owns is swept (sweepOrphans).
//
// liveSandboxes are the ids the controller kept.
func (s *Service) Recover(ctx context.Context, liveSandboxes []string) error {
	err := s.store.ForEach(podBucket, func(id string, data []byte) error {
		var rec podRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode pod %s: %w", id, err)
		}
		var cfg runtime.PodSandboxConfig
		if err := protojson.Unmarshal(rec.Config, &cfg); err != nil {
			return fmt.Errorf("decode config of pod %s: %w", id, err)
		}
		p := &pod{rec: rec, config: &cfg, nameKey: podName(cfg.GetMetadata())}
		if err := s.podNames.reserve(p.nameKey, id); err != nil {
			return fmt.Errorf("recover pod %s: %w", id, err)
		}
		// Before any new pod gets a level: this pod's stays its own.
		if err := s.labels.hold(rec.ProcessLabel); err != nil {
			s.log.Warn("reserve SELinux level of recovered pod", "pod", id, "label", rec.ProcessLabel, "err", err)
		}
		s.pods[id] = p
		return nil
	})
	if err != nil {
		return fmt.Errorf("load pods: %w", err)
	}
	live := map[string]bool{}
	for _, id := range liveSandboxes {
		live[id] = true
		if _, ok := s.pods[id]; !ok {
			s.log.Info("removing sandbox with no pod record", "pod", id)
			if err := s.ctrl.Remove(ctx, id); err != nil {
				s.log.Error("remove orphan sandbox", "pod", id, "err", err)
			}
		}
	}
	if err := s.loadContainers(); err != nil {
		return err
	}
	s.settleContainers(ctx, live)
	for id := range s.pods {
		if !live[id] {
			// Only RemovePodSandbox deletes a sandbox before the pod record: finish it.
			s.log.Info("completing pod removal cut short by a restart", "pod", id)
			if _, err := s.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
				s.log.Error("complete pod removal", "pod", id, "err", err)
			}
		}
	}
	s.sweepOrphans(ctx)
	s.log.Info("recovered pods and containers", "pods", len(s.pods), "containers", len(s.containers))
	return nil
}

// loadContainers loads the container records.
func (s *Service) loadContainers() error {
	err := s.store.ForEach(containerBucket, func(id string, data []byte) error {
		var rec containerRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode container %s: %w", id, err)
		}
		var cfg runtime.ContainerConfig
		if err := protojson.Unmarshal(rec.Config, &cfg); err != nil {
			return fmt.Errorf("decode config of container %s: %w", id, err)
		}
		c := newContainer(rec, &cfg, "")
		if p := s.pods[rec.PodID]; p != nil {
			c.nameKey = containerName(cfg.GetMetadata(), p.config.GetMetadata())
			_ = s.ctrNames.reserve(c.nameKey, id)
		}
		if rec.State == stateExited {
			c.markExited()
		}
		if err := s.labels.hold(rec.ProcessLabel); err != nil {
			s.log.Warn("reserve SELinux level of recovered container", "container", id, "label", rec.ProcessLabel, "err", err)
		}
		s.containers[id] = c
		return nil
	})
	if err != nil {
		return fmt.Errorf("load containers: %w", err)
	}
	return nil
}

// settleContainers brings each container record in line with its shim:
//   - of a pod whose sandbox is gone: exited, for the pod's removal to finish;
//   - whose bundle is gone while its pod's shim runs: a RemoveContainer cut short
//     (only it deletes the bundle of a recorded container), finished here;
//   - created, while the shim already runs it: a StartContainer cut short after the
//     shim started it, recorded as started;
//   - running: watched for its exit again (which the shim kept).
func (s *Service) settleContainers(ctx context.Context, live map[string]bool) {
	var removing []*container
	for _, c := range s.containers {
		rec := c.snapshot()
		shimUp := false
		if st, err := s.ctrl.Status(rec.PodID); err == nil {
			shimUp = st.ShimAlive
		}
		switch {
		case !live[rec.PodID]:
			s.markLost(c, "its pod sandbox was removed")
		case shimUp && !s.ctrl.HasContainerBundle(rec.ID):
			s.markLost(c, "its removal was cut short by a restart")
			removing = append(removing, c)
		case rec.State == stateCreated && shimUp:
			s.settleCreated(ctx, c)
		case rec.State == stateRunning && !shimUp:
			// Its pod's shim died: the controller has killed the pod already; record
			// that before anything is served.
			if ctx, cancel, rec, ok := s.claimMonitor(c); ok {
				s.awaitExit(ctx, c, rec)
				cancel()
			}
		case rec.State == stateRunning:
			// The shim kept the container (and any exit) while criserver was away.
			s.monitor(c)
		}
	}
	for _, c := range removing {
		s.log.Info("completing container removal cut short by a restart", "container", c.rec.ID)
		if err := s.removeContainer(ctx, c); err != nil {
			s.log.Error("complete container removal", "container", c.rec.ID, "err", err)
		}
	}
}

// markLost records a container that is not running (any more) without an exit from
// its shim, and why.
func (s *Service) markLost(c *container, why string) {
	c.mu.Lock()
	if c.rec.State != stateExited {
		if c.rec.State == stateRunning {
			c.rec.FinishedAt = time.Now().UnixNano()
		}
		c.rec.State, c.rec.ExitCode, c.rec.Reason = stateExited, 255, "Unknown"
		c.rec.Message = "the container is gone: " + why
	}
	c.mu.Unlock()
	c.markExited()
}

// settleCreated records as started a container the shim has started: StartContainer
// was cut short between the shim's start and the record.
func (s *Service) settleCreated(ctx context.Context, c *container) {
	rec := c.snapshot()
	st, err := s.ctrl.StateOf(ctx, rec.PodID, rec.ID)
	if err != nil || (st.Status != "running" && st.Status != "stopped") {
		return
	}
	s.log.Info("completing container start cut short by a restart", "container", rec.ID, "shim_state", st.Status)
	c.mu.Lock()
	c.rec.State, c.rec.StartedAt, c.rec.Pid = stateRunning, time.Now().UnixNano(), st.Pid
	r := c.rec
	c.mu.Unlock()
	if err := s.store.Put(containerBucket, r.ID, r); err != nil {
		s.log.Error("record container start", "container", r.ID, "err", err)
	}
	s.monitor(c)
}

// sweepOrphans removes what no record owns, left by a criserver killed in the middle
// of an operation: temporary dirs of interrupted calls, container bundles and
// writable snapshots and image volumes of a CreateContainer cut short, files and
// /dev/shm of pods that never got a record. Nothing is being created while it runs.
func (s *Service) sweepOrphans(ctx context.Context) {
	s.sweepTempDirs()
	hasRecord := func(id string) bool { _, ok := s.containers[id]; return ok }
	removed, err := s.ctrl.RemoveOrphanContainers(ctx, hasRecord)
	if err != nil {
		s.log.Error("remove orphan containers", "err", err)
	}
	for _, id := range removed {
		s.log.Info("removed container with no record", "container", id)
	}
	keys, err := s.images.RootfsKeys()
	if err != nil {
		s.log.Error("list container rootfs snapshots", "err", err)
	}
	for _, key := range keys {
		if hasRecord(key) {
			continue
		}
		if err := s.images.RemoveRootfs(key); err != nil {
			s.log.Error("remove rootfs with no container", "container", key, "err", err)
			continue
		}
		s.log.Info("removed rootfs with no container", "container", key)
	}
	s.sweepImageVolumes(hasRecord)
	for _, dir := range []string{filepath.Join(s.cfg.RootDir, "pods"), filepath.Join(s.cfg.StateDir, "pods")} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if _, ok := s.pods[e.Name()]; ok {
				continue
			}
			s.unmountShm(e.Name())
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				s.log.Error("remove files of unknown pod", "dir", filepath.Join(dir, e.Name()), "err", err)
			}
		}
	}
}

// sweepTempDirs removes the state dir's temporaries: a rootfs mounted to resolve
// users (rootfs-*), a checkpoint being unpacked (restore-*), the FIFOs of exec and
// attach sessions and the sockets of gVisor port-forwards, which all ended with the
// process that served them.
func (s *Service) sweepTempDirs() {
	entries, _ := os.ReadDir(s.cfg.StateDir)
	var errs []error
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(s.cfg.StateDir, name)
		switch {
		case strings.HasPrefix(name, "rootfs-"):
			if err := mount.Unmount(path); err != nil {
				errs = append(errs, err)
				continue
			}
		case strings.HasPrefix(name, "restore-"), name == "exec", name == "attach", name == portForwardDir:
		default:
			continue
		}
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Error("remove temporaries of the previous run", "err", err)
	}
}

// sweepImageVolumes unmounts and drops the image volumes (mounts and image views) of
// containers with no record: a CreateContainer cut short between its mounts and its
// record (RemoveContainer unmounts before it deletes the record).
func (s *Service) sweepImageVolumes(hasRecord func(string) bool) {
	owners, err := s.imageVolumeOwners()
	if err != nil {
		s.log.Error("list image volumes", "err", err)
	}
	for _, id := range owners {
		if hasRecord(id) {
			continue
		}
		if err := s.unmountImageVolumes(id); err != nil {
			s.log.Error("remove image volumes with no container", "container", id, "err", err)
			continue
		}
		s.log.Info("removed image volumes with no container", "container", id)
	}
}
