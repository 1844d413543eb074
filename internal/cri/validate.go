package cri

import (
	"math"
	"net"
	"path"
	"slices"
	"strings"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/cri/spec"
	"github.com/crisp-runtime/crisp/internal/podfiles"
)

// maxHostname is the kernel's limit on a UTS hostname.
const maxHostname = podfiles.MaxHostname

// maxTimeoutSeconds is the longest timeout, in seconds, a time.Duration holds (about
// 292 years).
const maxTimeoutSeconds = int64(math.MaxInt64 / time.Second)

// criTimeout converts a CRI timeout in seconds (ExecSync, StopContainer,
// CheckpointContainer) to a time.Duration. A plain time.Duration(s)*time.Second
// overflows past maxTimeoutSeconds: math.MaxInt64 wraps to -1s, an instant timeout
// where the caller meant "effectively none". Longer timeouts become the longest
// Duration instead. Zero and negative timeouts are 0, the CRI's default, which each
// caller gives its meaning (no limit for ExecSync, an immediate SIGKILL for
// StopContainer), as containerd treats negative ones.
func criTimeout(seconds int64) time.Duration {
	switch {
	case seconds <= 0:
		return 0
	case seconds > maxTimeoutSeconds:
		return math.MaxInt64
	}
	return time.Duration(seconds) * time.Second
}

// validatePodConfig checks what kubelet can get wrong before anything is created.
func validatePodConfig(cfg *runtime.PodSandboxConfig, cgroupDriver string) error {
	if cfg == nil {
		return invalid("pod sandbox config is required")
	}
	md := cfg.GetMetadata()
	if md == nil {
		return invalid("pod sandbox config has no metadata: name, namespace and uid are required")
	}
	for field, v := range map[string]string{"name": md.GetName(), "namespace": md.GetNamespace(), "uid": md.GetUid()} {
		if v == "" {
			return invalid("pod sandbox metadata.%s is empty", field)
		}
		if strings.ContainsAny(v, "/\x00") || v == "." || v == ".." {
			return invalid("pod sandbox metadata.%s %q must not contain '/' or NUL or be '.' or '..'", field, v)
		}
	}
	if err := validatePodHostname(cfg); err != nil {
		return err
	}
	// The check crisp's shim makes too, for containerd's pods.
	if err := podDNS(cfg.GetDnsConfig()).Validate(); err != nil {
		return invalid("%v", err)
	}
	for _, pm := range cfg.GetPortMappings() {
		if pm.GetContainerPort() <= 0 || pm.GetContainerPort() > 65535 {
			return invalid("port_mappings: container_port %d is out of range 1-65535", pm.GetContainerPort())
		}
		if pm.GetHostPort() < 0 || pm.GetHostPort() > 65535 {
			return invalid("port_mappings: host_port %d is out of range 0-65535", pm.GetHostPort())
		}
		if ip := pm.GetHostIp(); ip != "" && net.ParseIP(ip) == nil {
			return invalid("port_mappings: host_ip %q is not an IP address", ip)
		}
	}
	linux := cfg.GetLinux()
	nsOpts := linux.GetSecurityContext().GetNamespaceOptions()
	switch nsOpts.GetNetwork() {
	case runtime.NamespaceMode_POD, runtime.NamespaceMode_NODE:
	default:
		return invalid("namespace_options.network must be POD or NODE, got %s", nsOpts.GetNetwork())
	}
	switch nsOpts.GetIpc() {
	case runtime.NamespaceMode_POD, runtime.NamespaceMode_NODE:
	default:
		return invalid("namespace_options.ipc must be POD or NODE, got %s", nsOpts.GetIpc())
	}
	switch nsOpts.GetPid() {
	case runtime.NamespaceMode_POD, runtime.NamespaceMode_CONTAINER, runtime.NamespaceMode_NODE:
	default:
		return invalid("namespace_options.pid must be POD, CONTAINER or NODE for a pod, got %s", nsOpts.GetPid())
	}
	// As containerd does for the sandbox: a group alone would pair with whatever user
	// the pause image names.
	if sc := linux.GetSecurityContext(); sc.GetRunAsGroup() != nil && sc.GetRunAsUser() == nil {
		return invalid("pod security_context.run_as_group %d is set without run_as_user: set the user too (runAsUser in the pod's securityContext)", sc.GetRunAsGroup().GetValue())
	}
	userNS, err := spec.PodUserNS(nsOpts)
	if err != nil {
		return err
	}
	if userNS != nil {
		if err := spec.CheckPodUserNS(cfg); err != nil {
			return err
		}
	}
	hostNet := nsOpts.GetNetwork() == runtime.NamespaceMode_NODE
	hostIPC := nsOpts.GetIpc() == runtime.NamespaceMode_NODE
	for k, v := range linux.GetSysctls() {
		if err := validateSysctl(k, v, hostNet, hostIPC); err != nil {
			return err
		}
	}
	if p := linux.GetCgroupParent(); p != "" {
		if err := validateCgroupParent(p, cgroupDriver); err != nil {
			return err
		}
	}
	return nil
}

// cgroupParent is the cgroup parent the pod runs under, from a checked
// cgroup_parent: with the systemd driver the slice a path ends in (a.slice/b.slice
// → b.slice), as containerd and CRI-O take it; else the value as given.
func cgroupParent(p, driver string) string {
	if driver == config.CgroupDriverSystemd && p != "" {
		return path.Base(p)
	}
	return p
}

// validatePodHostname checks the hostname the pod's /etc/hostname and /etc/hosts will
// carry as crisp's shim checks it for containerd's pods (podfiles.ValidateHostname): the
// one given, or without one the pod's name, which runPodHostname falls back to unless
// the pod is on the host network (it gets the node's name then).
func validatePodHostname(cfg *runtime.PodSandboxConfig) error {
	if h := cfg.GetHostname(); h != "" {
		if err := podfiles.ValidateHostname(h); err != nil {
			return invalid("%v", err)
		}
		return nil
	}
	if cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtime.NamespaceMode_NODE {
		return nil
	}
	if err := podfiles.ValidateHostname(runPodHostname(cfg, false)); err != nil {
		return invalid("pod sandbox metadata.name %q is the pod's hostname when no hostname is given: %v", cfg.GetMetadata().GetName(), err)
	}
	return nil
}

func validateSysctl(key, value string, hostNet, hostIPC bool) error {
	k := strings.ReplaceAll(key, "/", ".")
	if k == "" || strings.Contains(k, "..") || strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.ContainsAny(k, " \x00") {
		return invalid("sysctl %q is not a valid sysctl name", key)
	}
	if strings.ContainsAny(value, "\n\x00") {
		return invalid("sysctl %s: value must be one line", key)
	}
	namespaced := strings.HasPrefix(k, "net.") || strings.HasPrefix(k, "kernel.shm") || strings.HasPrefix(k, "kernel.msg") || k == "kernel.sem" || strings.HasPrefix(k, "fs.mqueue.")
	if !namespaced {
		return invalid("sysctl %s is not namespaced: setting it in a pod would change the node", key)
	}
	if hostNet && strings.HasPrefix(k, "net.") {
		return invalid("sysctl %s cannot be set in a pod that uses the host network", key)
	}
	if hostIPC && !strings.HasPrefix(k, "net.") {
		return invalid("sysctl %s cannot be set in a pod that uses the host IPC namespace", key)
	}
	return nil
}

func validateCgroupParent(p, driver string) error {
	if driver == config.CgroupDriverSystemd {
		// A path whose last element is a slice stands for that slice, as containerd's
		// getCgroupsPath and CRI-O read it (critest sends "/test.slice"); its other
		// elements must still make a clean path.
		if strings.Contains(p, "/") && (path.Clean(p) != strings.TrimSuffix(p, "/") || slices.Contains(strings.Split(p, "/"), "..")) {
			return invalid("cgroup_parent %q must be a clean path (no '..' or '//') ending in a systemd slice name", p)
		}
		if base := path.Base(p); !strings.HasSuffix(base, ".slice") || base == ".slice" {
			return invalid("cgroup_parent %q must be a systemd slice name (like kubepods-pod1.slice), or a path ending in one, with the systemd cgroup driver", p)
		}
		return nil
	}
	if !strings.HasPrefix(p, "/") {
		return invalid("cgroup_parent %q must be an absolute cgroup path with the cgroupfs driver", p)
	}
	if path.Clean(p) != p && path.Clean(p)+"/" != p {
		return invalid("cgroup_parent %q must be a clean path (no '..' or '//')", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return invalid("cgroup_parent %q must not contain '..'", p)
		}
	}
	return nil
}
