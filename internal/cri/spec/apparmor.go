package spec

import (
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// AppArmor is the host's AppArmor as the mapping needs it (package apparmor); nil in
// Input means the host has none or disable_apparmor is set.
type AppArmor interface {
	// EnsureDefault loads the runtime's default profile if it is not loaded and
	// returns its name.
	EnsureDefault() (string, error)
	// Loaded reports whether a profile of that name is loaded.
	Loaded(name string) (bool, error)
}

// The deprecated apparmor_profile string's forms (kubelet's annotation values).
const (
	apparmorRuntimeDefault  = "runtime/default"
	apparmorUnconfined      = "unconfined"
	apparmorLocalhostPrefix = "localhost/"
)

// apparmorRequest is the profile a container asks for: the apparmor field if set (it
// wins over the deprecated string, as in containerd and kubelet), else the string.
// unset is true when neither says anything; name is a Localhost profile's name.
func apparmorRequest(sc *runtime.LinuxContainerSecurityContext) (kind runtime.SecurityProfile_ProfileType, name string, unset bool, err error) {
	if sp := sc.GetApparmor(); sp != nil {
		switch sp.GetProfileType() {
		case runtime.SecurityProfile_RuntimeDefault, runtime.SecurityProfile_Unconfined:
			if sp.GetLocalhostRef() != "" {
				return 0, "", false, invalidf("apparmor localhost_ref %q is only valid with profile type Localhost", sp.GetLocalhostRef())
			}
			return sp.GetProfileType(), "", false, nil
		case runtime.SecurityProfile_Localhost:
			name = strings.TrimPrefix(sp.GetLocalhostRef(), apparmorLocalhostPrefix)
			if name == "" {
				return 0, "", false, invalidf("apparmor profile type Localhost needs a localhost_ref naming a profile loaded on the node")
			}
			return sp.GetProfileType(), name, false, nil
		default:
			return 0, "", false, invalidf("unknown apparmor profile type %d", sp.GetProfileType())
		}
	}
	//lint:ignore SA1019 kubelet still sends the deprecated string next to the field, and containerd honours it.
	switch p := sc.GetApparmorProfile(); {
	case p == "":
		return runtime.SecurityProfile_RuntimeDefault, "", true, nil
	case p == apparmorRuntimeDefault:
		return runtime.SecurityProfile_RuntimeDefault, "", false, nil
	case p == apparmorUnconfined:
		return runtime.SecurityProfile_Unconfined, "", false, nil
	case strings.HasPrefix(p, apparmorLocalhostPrefix) && len(p) > len(apparmorLocalhostPrefix):
		return runtime.SecurityProfile_Localhost, strings.TrimPrefix(p, apparmorLocalhostPrefix), false, nil
	default:
		return 0, "", false, invalidf("invalid apparmor profile %q: want %q, %q or %q<name>", p, apparmorRuntimeDefault, apparmorUnconfined, apparmorLocalhostPrefix)
	}
}

// apparmorFor is the AppArmor profile of a container's process ("" runs it with the
// runtime's own, unconfined), as containerd 2.x chooses it (sputil's
// GenerateApparmorSpecOpts): crisp's default profile for an unset or RuntimeDefault
// request, a Localhost profile only if it is loaded, nothing for Unconfined. For a
// privileged container the runtime's default is unconfined, so unset and
// RuntimeDefault give nothing (an explicit RuntimeDefault with a warning saying so),
// but a Localhost profile the user named is applied like anyone's.
//
// The outcome depends only on whether crisp can give what was asked: on a host
// without AppArmor (or with disable_apparmor) a request that would run unconfined
// anyway (unset, Unconfined, RuntimeDefault on a privileged container) succeeds, and
// one that needs confinement (Localhost, RuntimeDefault on a non-privileged
// container) fails with FailedPrecondition rather than run without it. containerd
// also refuses the privileged RuntimeDefault case there ("apparmor is not
// supported"), although AppArmor would not have confined it.
func apparmorFor(sc *runtime.LinuxContainerSecurityContext, aa AppArmor) (profile, warning string, err error) {
	kind, name, unset, err := apparmorRequest(sc)
	if err != nil {
		return "", "", err
	}
	switch {
	case kind == runtime.SecurityProfile_Unconfined:
		return "", "", nil
	case kind == runtime.SecurityProfile_RuntimeDefault && sc.GetPrivileged():
		if unset {
			return "", "", nil
		}
		return "", "apparmor profile RuntimeDefault gives a privileged container no profile: it runs unconfined", nil
	case aa == nil && unset:
		return "", "", nil
	case aa == nil:
		return "", "", failedPreconditionf("apparmor profile %s requested, but AppArmor is not enabled on this node (or criserver has disable_apparmor set)", apparmorName(kind, name))
	case kind == runtime.SecurityProfile_RuntimeDefault:
		profile, err = aa.EnsureDefault()
		return profile, "", err
	}
	loaded, err := aa.Loaded(name)
	if err != nil {
		return "", "", err
	}
	if !loaded {
		return "", "", failedPreconditionf("apparmor profile not found %s: load it on the node (apparmor_parser) before creating the container", name)
	}
	return name, "", nil
}

// apparmorName is a requested profile as the user wrote it, for messages.
func apparmorName(kind runtime.SecurityProfile_ProfileType, name string) string {
	if kind == runtime.SecurityProfile_Localhost {
		return apparmorLocalhostPrefix + name
	}
	return kind.String()
}
