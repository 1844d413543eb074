package wasm

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
)

// Features is what the runner can run, as an OCI runtime features document for -info.
// A module's process joins no namespace of the pod (WASI confines it: it sees only its
// preopened directories and has no sockets), so the document lists none, and with no
// "user" namespace the runtime neither advertises nor accepts user-namespaced pods on
// the handler: their files would be written as the host's root. Read-only and
// recursively read-only binds are both honoured, as read-only preopens (a preopen has
// no submounts to leave writable). Cgroups of every kind hold the module's process; no
// LSM profile or seccomp filter is applied to it.
func Features() *features.Features {
	t, f := true, false
	return &features.Features{
		OCIVersionMin: "1.0.0",
		OCIVersionMax: specs.Version,
		MountOptions:  []string{"bind", "rbind", "ro", "rro", "rw"},
		Linux: &features.Linux{
			Namespaces: []string{},
			Cgroup:     &features.Cgroup{V1: &t, V2: &t, Systemd: &t},
			Apparmor:   &features.Apparmor{Enabled: &f},
			Selinux:    &features.Selinux{Enabled: &f},
			Seccomp:    &features.Seccomp{Enabled: &f},
		},
	}
}
