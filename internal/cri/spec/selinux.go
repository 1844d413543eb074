package spec

import (
	"path/filepath"

	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// systemPaths are the host directories no volume relabel may touch: relabelling one
// would take it from the host's own services (the list opencontainers/selinux's Chcon
// refuses, which containerd and CRI-O rely on).
var systemPaths = map[string]bool{
	"/": true, "/bin": true, "/boot": true, "/dev": true, "/etc": true, "/etc/passwd": true,
	"/etc/pki": true, "/etc/shadow": true, "/home": true, "/lib": true, "/lib64": true,
	"/media": true, "/opt": true, "/proc": true, "/root": true, "/run": true, "/sbin": true,
	"/srv": true, "/sys": true, "/tmp": true, "/usr": true, "/var": true, "/var/lib": true,
	"/var/log": true,
}

// applySELinux puts the container's SELinux labels in s and returns the host paths
// of the mounts to relabel. A privileged container gets no process label (containerd:
// the policy runs it as its privileged type); its mounts still get the mount label.
// Without labels, SELinux options are ignored with a warning, as containerd ignores
// them with SELinux off, and selinux_relabel does nothing.
func applySELinux(s *specs.Spec, in Input, privileged bool) (relabel []string, warning string, err error) {
	sc := in.Config.GetLinux().GetSecurityContext()
	if in.ProcessLabel == "" && in.MountLabel == "" {
		if se := sc.GetSelinuxOptions(); se.GetType() != "" || se.GetLevel() != "" || se.GetRole() != "" || se.GetUser() != "" {
			warning = "SELinux options ignored: SELinux labelling is off on this node (enable_selinux, or the host has no SELinux)"
		}
		return nil, warning, nil
	}
	if !privileged {
		s.Process.SelinuxLabel = in.ProcessLabel
	}
	s.Linux.MountLabel = in.MountLabel
	if in.MountLabel == "" {
		return nil, "", nil
	}
	for _, m := range in.Config.GetMounts() {
		if !m.GetSelinuxRelabel() || m.GetHostPath() == "" {
			continue
		}
		p, err := relabelPath(m)
		if err != nil {
			return nil, "", err
		}
		relabel = append(relabel, p)
	}
	return relabel, "", nil
}

// relabelPath is the host path of a mount kubelet asks to relabel, refused when it is
// (or resolves to) a system directory.
func relabelPath(m *runtime.Mount) (string, error) {
	p, err := filepath.EvalSymlinks(m.GetHostPath())
	if err != nil {
		return "", invalidf("mount host_path %q (for %s): %v", m.GetHostPath(), m.GetContainerPath(), err)
	}
	for _, c := range []string{filepath.Clean(m.GetHostPath()), p} {
		if systemPaths[c] {
			return "", invalidf("mount at %s: host path %s is a system directory and cannot be relabelled for SELinux (selinux_relabel): give the volume a directory of its own below it", m.GetContainerPath(), c)
		}
	}
	return p, nil
}
