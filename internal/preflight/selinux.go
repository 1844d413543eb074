package preflight

import (
	"fmt"

	"github.com/opencontainers/selinux/go-selinux"
	"github.com/opencontainers/selinux/go-selinux/label"
)

// SELinux is the host's SELinux as the check sees it.
type SELinux struct {
	// Mode is "enforcing", "permissive" or "" (SELinux off or absent).
	Mode string
	// Process and File are the container contexts the policy names
	// (contexts/lxc_contexts: what pods would run as), "" when it names none.
	Process, File string
	// Invalid is why the loaded policy rejects Process (the container module's types
	// are not loaded); nil when it accepts it.
	Invalid error
}

// hostSELinux reads the running host's SELinux through opencontainers/selinux, the
// library criserver labels with.
func hostSELinux() SELinux {
	if !selinux.GetEnabled() {
		return SELinux{}
	}
	s := SELinux{Mode: "permissive"}
	if selinux.EnforceMode() == selinux.Enforcing {
		s.Mode = "enforcing"
	}
	proc, file, err := label.InitLabels(nil)
	if err != nil {
		s.Invalid = err
		return s
	}
	selinux.ReleaseLabel(proc)
	s.Process, s.File = proc, file
	if proc != "" {
		s.Invalid = selinux.SecurityCheckContext(proc)
	}
	return s
}

// checkSELinux says whether pods will be labelled: on an SELinux host with
// enable_selinux, each pod gets its own MCS level and its containers the policy's
// container type (as containerd and CRI-O); a host without SELinux is fine, as for
// containerd: nothing is labelled there.
func checkSELinux(h Host, enabled bool) Result {
	r := Result{Name: "security.selinux"}
	var se SELinux
	if h.SELinux != nil {
		se = h.SELinux()
	}
	switch {
	case se.Mode == "":
		r.Detail = "not enabled on this host: pods and containers get no SELinux labels, and seLinuxOptions are ignored"
	case !enabled:
		r.Status, r.Detail = Warn, se.Mode+", but enable_selinux is false: containers run in criserver's own domain, not kept apart by MCS levels"
	case se.Process == "":
		r.Status, r.Detail = Warn, se.Mode+", but the policy names no container contexts (contexts/lxc_contexts): containers run unlabelled; install the policy's container module"
	case se.Invalid != nil:
		r.Status, r.Detail = Warn, fmt.Sprintf("%s, but the loaded policy rejects the container label %s (%v): load the policy's container module", se.Mode, se.Process, se.Invalid)
	default:
		r.Detail = fmt.Sprintf("%s; each pod gets its own MCS level: processes %s, files %s", se.Mode, se.Process, se.File)
	}
	return r
}
