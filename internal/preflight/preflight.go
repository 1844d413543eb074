// Package preflight tells an operator, before kubelet does, what this node lacks for
// crisp: kernel features, cgroups, the cgroup driver kubelet expects, CNI configs and
// plugins, the shim of every runtime handler and the sysctls kubelet's networking
// needs. `criserver check` runs it. Every check only reads: it never loads a module
// or an AppArmor profile, writes a config or changes a sysctl (the idmapped-mount
// probe mounts a throwaway overlay in a temporary directory and removes it).
package preflight

import (
	"fmt"
	"io"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/cri/apparmor"
	"github.com/crisp-runtime/crisp/internal/cri/spec"
)

// Status is the outcome of one check.
type Status int

// A required check that fails is Fail; an optional one (a feature only some pods
// use) is Warn.
const (
	OK Status = iota
	Warn
	Fail
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	default:
		return "FAIL"
	}
}

// Result is one line of the report.
type Result struct {
	Name   string // e.g. "kernel.overlayfs"
	Status Status
	Detail string // what was found, and for a failure what to do
}

// Host is where the checks look. The zero value is not usable: Default gives the
// running node; tests point the directories at fake trees and replace the probes.
type Host struct {
	ProcDir       string // /proc
	SysDir        string // /sys
	SystemdDir    string // /run/systemd/system: exists when systemd is PID 1
	KubeletConfig string // kubelet's config file (cgroupDriver)
	// RecursiveReadOnly and IDMappedMounts probe the running kernel (internal/cri/spec's probes,
	// the ones criserver advertises features from).
	RecursiveReadOnly func() bool
	IDMappedMounts    func(dir string) error
	// ResolveShim finds a runtime handler's shim binary as criserver would.
	ResolveShim func(name string) (string, error)
	// NATChain lists a chain of the nat table (iptables -S, ip6tables for v6).
	NATChain func(v6 bool, chain string) (string, error)
	// AppArmor is the host's AppArmor as criserver would use it (nil: none).
	AppArmor func() AppArmor
	// SELinux is the host's SELinux (its zero value: none).
	SELinux func() SELinux
}

// AppArmor is what the AppArmor check asks of the host's (package apparmor).
type AppArmor interface {
	DefaultLoaded() (bool, error)
}

// DefaultKubeletConfig is where kubeadm and most installers put kubelet's config file.
const DefaultKubeletConfig = "/var/lib/kubelet/config.yaml"

// Default returns the running node.
func Default() Host {
	return Host{
		ProcDir:           "/proc",
		SysDir:            "/sys",
		SystemdDir:        "/run/systemd/system",
		KubeletConfig:     DefaultKubeletConfig,
		RecursiveReadOnly: spec.RecursiveReadOnlySupported,
		IDMappedMounts:    spec.IDMappedMountsSupported,
		ResolveShim:       controller.ResolveShim,
		NATChain:          listNATChain,
		AppArmor: func() AppArmor {
			// Not `return apparmor.New(false)`: a nil handle would make a non-nil AppArmor.
			if h := apparmor.New(false); h != nil { //nolint:revive // if-return: see above
				return h
			}
			return nil
		},
		SELinux: hostSELinux,
	}
}

// Run runs every check against cfg on h, in a fixed order.
func Run(cfg config.Config, h Host) []Result {
	var out []Result
	out = append(out, checkOverlay(h))
	out = append(out, checkUserNS(h))
	out = append(out, checkIDMapped(h, cfg.RootDir))
	out = append(out, checkMountSetattr(h))
	cg := checkCgroups(h)
	out = append(out, cg...)
	out = append(out, checkCgroupDriver(h, cfg.CgroupDriver))
	out = append(out, checkCNI(cfg.CNI)...)
	out = append(out, checkMasquerade(h, cfg.CNI))
	out = append(out, checkShims(h, cfg)...)
	out = append(out, checkSysctls(h)...)
	out = append(out, checkAppArmor(h, cfg.DisableAppArmor))
	out = append(out, checkSELinux(h, cfg.EnableSELinux))
	return out
}

// Write prints one line per result and reports whether any failed.
func Write(w io.Writer, results []Result) (failed bool) {
	for _, r := range results {
		_, _ = fmt.Fprintf(w, "%-4s %-36s %s\n", r.Status, r.Name, r.Detail)
		if r.Status == Fail {
			failed = true
		}
	}
	return failed
}
