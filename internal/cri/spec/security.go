package spec

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/pkg/cap"
	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// defaultCapabilities is containerd's (and docker's) default capability set for a
// container that is not privileged.
var defaultCapabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FSETID",
	"CAP_FOWNER",
	"CAP_MKNOD",
	"CAP_NET_RAW",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETFCAP",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT",
	"CAP_KILL",
	"CAP_AUDIT_WRITE",
}

// defaultMaskedPaths are containerd's default masked paths (oci.populateDefaultUnixSpec),
// including the per-CPU thermal_throttle directories present on this host.
func defaultMaskedPaths() []string {
	return append([]string{
		"/proc/acpi",
		"/proc/asound",
		"/proc/interrupts",
		"/proc/kcore",
		"/proc/keys",
		"/proc/latency_stats",
		"/proc/timer_list",
		"/proc/timer_stats",
		"/proc/sched_debug",
		"/sys/firmware",
		"/sys/devices/virtual/powercap",
		"/proc/scsi",
	}, throttlePaths()...)
}

// defaultReadonlyPaths are containerd's default read-only paths.
func defaultReadonlyPaths() []string {
	return []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
}

// capName normalises a CRI capability name: kubelet sends "NET_ADMIN", other clients
// "CAP_NET_ADMIN" or lower case; all mean the same. Unknown names are refused rather
// than passed to runc, which would only warn and run the container without them.
func capName(c string) (string, error) {
	n := strings.ToUpper(strings.TrimSpace(c))
	if !strings.HasPrefix(n, "CAP_") {
		n = "CAP_" + n
	}
	if !slices.Contains(cap.Known(), n) {
		return "", invalidf("unknown capability %q", c)
	}
	return n, nil
}

// isAll reports whether a CRI capability entry is the "ALL" keyword.
func isAll(c string) bool {
	return strings.EqualFold(strings.TrimSpace(c), "ALL")
}

// capabilities computes the process capability sets. Privileged containers get every
// capability (containerd's oci.WithPrivileged, applied after add/drop, so drops do not
// apply). Otherwise containerd's WithCapabilities: start from the default set, "ALL" in
// add means every capability and "ALL" in drop means none, then the named adds, then the
// named drops. Ambient capabilities (add_ambient_capabilities) are added to every set:
// the kernel only keeps an ambient capability that is also permitted and inheritable.
func capabilities(c *runtime.Capability, privileged bool) (*specs.LinuxCapabilities, error) {
	all, err := allCapabilities()
	if err != nil {
		return nil, err
	}
	caps := slices.Clone(defaultCapabilities)
	var adds, drops []string
	for _, a := range c.GetAddCapabilities() {
		if isAll(a) {
			caps = slices.Clone(all)
			continue
		}
		n, err := capName(a)
		if err != nil {
			return nil, err
		}
		adds = append(adds, n)
	}
	for _, d := range c.GetDropCapabilities() {
		if isAll(d) {
			caps = nil
			continue
		}
		n, err := capName(d)
		if err != nil {
			return nil, err
		}
		drops = append(drops, n)
	}
	for _, a := range adds {
		if !slices.Contains(caps, a) {
			caps = append(caps, a)
		}
	}
	caps = slices.DeleteFunc(caps, func(c string) bool { return slices.Contains(drops, c) })
	if privileged {
		caps = slices.Clone(all)
	}
	var ambient []string
	for _, a := range c.GetAddAmbientCapabilities() {
		n, err := capName(a)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(ambient, n) {
			ambient = append(ambient, n)
		}
		if !slices.Contains(caps, n) {
			caps = append(caps, n)
		}
	}
	return &specs.LinuxCapabilities{
		Bounding:    slices.Clone(caps),
		Effective:   slices.Clone(caps),
		Permitted:   slices.Clone(caps),
		Inheritable: slices.Clone(ambient),
		Ambient:     ambient,
	}, nil
}

// seccompProfile picks the CRI's seccomp profile: the seccomp field, else the
// deprecated seccomp_profile_path (containerd's GenerateSeccompSecurityProfile). nil
// means none was asked for.
func seccompProfile(sc *runtime.LinuxContainerSecurityContext) (*runtime.SecurityProfile, error) {
	if sp := sc.GetSeccomp(); sp != nil {
		return sp, nil
	}
	//lint:ignore SA1019 kubelet no longer sends it, but older clients (crictl configs) still do.
	p := sc.GetSeccompProfilePath()
	switch {
	case p == "":
		return nil, nil
	case p == "runtime/default" || p == "docker/default":
		return &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}, nil
	case p == "unconfined":
		return &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Unconfined}, nil
	case strings.HasPrefix(p, "localhost/"):
		return &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: strings.TrimPrefix(p, "localhost/")}, nil
	default:
		return nil, invalidf("seccomp_profile_path %q is not runtime/default, docker/default, unconfined or localhost/<path>", p)
	}
}

// seccompFor returns the seccomp filter for the spec s (whose capabilities are final:
// the default profile allows more syscalls to a container holding e.g. CAP_SYS_ADMIN).
// No profile means none (containerd; kubelet always sends one). Privileged containers
// never get one, as containerd and CRI-O do and Kubernetes documents ("privileged
// containers always run as Unconfined"); an explicit profile is then reported in a
// warning rather than applied.
func seccompFor(sc *runtime.LinuxContainerSecurityContext, s *specs.Spec) (*specs.LinuxSeccomp, string, error) {
	sp, err := seccompProfile(sc)
	if err != nil || sp == nil {
		return nil, "", err
	}
	if sp.GetProfileType() != runtime.SecurityProfile_Localhost && sp.GetLocalhostRef() != "" {
		return nil, "", invalidf("seccomp localhost_ref %q is only valid with profile type Localhost", sp.GetLocalhostRef())
	}
	if sc.GetPrivileged() {
		if sp.GetProfileType() == runtime.SecurityProfile_Unconfined {
			return nil, "", nil
		}
		return nil, "seccomp profile " + sp.GetProfileType().String() + " ignored: privileged containers run unconfined", nil
	}
	switch sp.GetProfileType() {
	case runtime.SecurityProfile_Unconfined:
		return nil, "", nil
	case runtime.SecurityProfile_RuntimeDefault:
		return seccomp.DefaultProfile(s), "", nil
	case runtime.SecurityProfile_Localhost:
		p, err := localhostSeccomp(strings.TrimPrefix(sp.GetLocalhostRef(), "localhost/"))
		return p, "", err
	default:
		return nil, "", invalidf("unknown seccomp profile type %d", sp.GetProfileType())
	}
}

// localhostSeccomp loads an OCI seccomp profile from the node (kubelet resolves
// localhostProfile under its seccomp root and sends the absolute path).
func localhostSeccomp(ref string) (*specs.LinuxSeccomp, error) {
	if !filepath.IsAbs(ref) {
		return nil, invalidf("seccomp localhost profile %q must be an absolute path", ref)
	}
	b, err := os.ReadFile(ref)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, invalidf("seccomp localhost profile %q does not exist on the node", ref)
		}
		return nil, invalidf("seccomp localhost profile %q cannot be read: %v", ref, err)
	}
	var p specs.LinuxSeccomp
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, invalidf("seccomp localhost profile %q is not an OCI seccomp profile: %v", ref, err)
	}
	return &p, nil
}

// maskedAndReadonlyPaths follows kubelet's contract: kubelet always sends the paths it
// wants, its defaults for procMount: Default and empty lists for procMount: Unmasked,
// so the CRI's lists are used exactly when set. Over gRPC an empty list arrives as nil,
// indistinguishable from no list at all (crictl). Unmasked is allowed only in a pod
// with a user namespace (hostUsers: false), so there nil means Unmasked, as containerd
// (which applies no masks unless the CRI sends some) honours it: no masked or
// read-only paths. Elsewhere nil can only come from a client that sent none, which
// gets containerd's defaults (containerd would mask nothing): a crictl container
// keeps /proc's sensitive files covered. A non-nil empty list from an in-process
// caller means "none". Privileged containers get none (oci.WithPrivileged).
func maskedAndReadonlyPaths(sc *runtime.LinuxContainerSecurityContext, userNS bool) (masked, readonly []string) {
	if sc.GetPrivileged() {
		return nil, nil
	}
	masked, readonly = sc.GetMaskedPaths(), sc.GetReadonlyPaths()
	if userNS && masked == nil && readonly == nil {
		return nil, nil
	}
	if masked == nil {
		masked = defaultMaskedPaths()
	}
	if readonly == nil {
		readonly = defaultReadonlyPaths()
	}
	return slices.Clone(masked), slices.Clone(readonly)
}
