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
	if err := podfiles.MountShm(s.shmPath(id), shmLabel(mountLabel, s.shmLabelOff)); err != nil {
		return fmt.Errorf("pod %s: %w", id, err)
	}
	return nil
}

// shmLabel is the SELinux context of a pod's /dev/shm: the pod's mount label, or,
// with labelling off on an SELinux host, the policy's file label for privileged
// containers (off is the label initSELinux read before it disabled the library). A
// tmpfs mounted with no context takes criserver's domain's runtime type
// (initrc_runtime_t), on which the shim's domain may not mount: under enforcing,
// every container of such a pod would fail to start.
func shmLabel(mountLabel, off string) string {
	if mountLabel != "" {
		return mountLabel
	}
	return off
}

func (s *Service) unmountShm(id string) {
	if err := mount.Unmount(s.shmPath(id)); err != nil {
		s.log.Warn("unmount pod shm", "pod", id, "err", err)
	}
}
