package cri

import (
	"fmt"
	"path/filepath"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/mount"
	"github.com/crisp-runtime/crisp/internal/podfiles"
)

func (s *Service) podStateDir(id string) string { return filepath.Join(s.cfg.StateDir, "pods", id) }

func (s *Service) shmPath(id string) string { return filepath.Join(s.podStateDir(id), "shm") }

// podShm is the pod's shared /dev/shm, or "" when the pod uses the host's IPC.
func (s *Service) podShm(p *pod) string {
	if p.config.GetLinux().GetSecurityContext().GetNamespaceOptions().GetIpc() == runtime.NamespaceMode_NODE {
		return ""
	}
	return s.shmPath(p.rec.ID)
}

// mountShm gives the pod a tmpfs its containers share as /dev/shm, like the IPC
// namespace they share, with the pod's SELinux mount label; host-IPC pods use the
// host's /dev/shm.
func (s *Service) mountShm(id string, cfg *runtime.PodSandboxConfig, mountLabel string) error {
	if cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetIpc() == runtime.NamespaceMode_NODE {
		return nil
	}
	if err := podfiles.MountShm(s.shmPath(id), mountLabel); err != nil {
		return fmt.Errorf("pod %s: %w", id, err)
	}
	return nil
}

func (s *Service) unmountShm(id string) {
	if err := mount.Unmount(s.shmPath(id)); err != nil {
		s.log.Warn("unmount pod shm", "pod", id, "err", err)
	}
}
