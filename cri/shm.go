package cri

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/mount"
)

// shmSize is the size of a pod's /dev/shm, as containerd and docker give it.
const shmSize = "size=65536k"

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
// namespace they share; host-IPC pods use the host's /dev/shm.
func (s *Service) mountShm(id string, cfg *runtime.PodSandboxConfig) error {
	if cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetIpc() == runtime.NamespaceMode_NODE {
		return nil
	}
	p := s.shmPath(id)
	if err := os.MkdirAll(p, 0o700); err != nil {
		return fmt.Errorf("create shm dir of pod %s: %w", id, err)
	}
	if err := unix.Mount("shm", p, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,"+shmSize); err != nil {
		return fmt.Errorf("mount /dev/shm of pod %s: %w", id, err)
	}
	return nil
}

func (s *Service) unmountShm(id string) {
	if err := mount.Unmount(s.shmPath(id)); err != nil {
		s.log.Warn("unmount pod shm", "pod", id, "err", err)
	}
}
