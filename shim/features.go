package shim

import (
	"github.com/opencontainers/runc/libcontainer/capabilities"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
)

// Features is what the shim can run, as an OCI runtime features document: the one
// `runc features` prints, made from the same libcontainer the shim runs containers
// with. containerd 2.x reads it from -info to decide a handler's CRI features: the
// "rro" mount option gives recursive read-only mounts, and the "user" namespace with
// ID-mapped mounts gives user namespaces. The shim runs containerd's user-namespaced
// pods under both sandboxers (idmapped spec mounts through libcontainer, a rootfs with
// containerd's uidmap/gidmap options as containerd mounts it, the shim sandboxer's
// pause joining containerd's user namespace), so it claims ID-mapped mounts as `runc
// features` does: unconditionally, the kernel's support being the snapshotter's to
// probe (containerd's overlayfs adds uidmap/gidmap only where the kernel idmaps).
func Features() *features.Features {
	t, f := true, false
	feat := &features.Features{
		OCIVersionMin: "1.0.0",
		OCIVersionMax: specs.Version,
		Hooks:         configs.KnownHookNames(),
		MountOptions:  specconv.KnownMountOptions(),
		Linux: &features.Linux{
			Namespaces:   specconv.KnownNamespaces(),
			Capabilities: capabilities.KnownCapabilities(),
			Cgroup:       &features.Cgroup{V1: &t, V2: &t, Systemd: &t},
			Apparmor:     &features.Apparmor{Enabled: &t},
			Selinux:      &features.Selinux{Enabled: &f},
			MountExtensions: &features.MountExtensions{
				IDMap: &features.IDMap{Enabled: &t},
			},
		},
	}
	if seccomp.Enabled {
		feat.Linux.Seccomp = &features.Seccomp{
			Enabled:        &t,
			Actions:        seccomp.KnownActions(),
			Operators:      seccomp.KnownOperators(),
			Archs:          seccomp.KnownArchs(),
			KnownFlags:     seccomp.KnownFlags(),
			SupportedFlags: seccomp.SupportedFlags(),
		}
	}
	return feat
}
