package spec

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Cgroup naming shared with the shim's pod cgroups (pkg/shimkit/pod): cgroupfs
// "<parent>/crisp-<id>", systemd "<slice>:crisp:<id>".
const (
	defaultCgroupParent = "/crisp"
	defaultSystemdSlice = "system.slice"
	cgroupPrefix        = "crisp"
)

var sliceRE = regexp.MustCompile(`^[A-Za-z0-9_.\\-]+\.slice$`)

// CgroupsPath is a container's cgroup (the pause container's too, for pods on a
// task-only shim): a sibling of the pod's own cgroup under the pod's CRI cgroup_parent
// (kubelet's pod cgroup), as containerd places containers.
func CgroupsPath(parent, id string, systemd bool) (string, error) {
	if systemd {
		if parent == "" {
			parent = defaultSystemdSlice
		}
		if !sliceRE.MatchString(parent) || !expandableSlice(parent) {
			return "", invalidf("cgroup_parent %q: the systemd cgroup driver wants a slice name like system.slice", parent)
		}
		return parent + ":" + cgroupPrefix + ":" + id, nil
	}
	if parent == "" {
		parent = defaultCgroupParent
	}
	if !path.IsAbs(parent) || path.Clean(parent) != parent || strings.Contains(parent, "..") {
		return "", invalidf("cgroup_parent %q: the cgroupfs driver wants an absolute, clean path", parent)
	}
	return path.Join(parent, cgroupPrefix+"-"+id), nil
}

// expandableSlice is the rule of libcontainer's systemd.ExpandSlice that sliceRE does
// not cover: every dash separates two non-empty parts ("-.slice", the root, aside).
// Checked here so that a name systemd refuses is InvalidArgument at CreateContainer;
// importing the systemd package would link dbus into criserver.
func expandableSlice(s string) bool {
	name := strings.TrimSuffix(s, ".slice")
	return name == "-" || !slices.Contains(strings.Split(name, "-"), "")
}

// nsModes are the namespace modes that apply to the container. Network and IPC belong
// to the pod (kubelet copies the pod's into each container's options; the pod's win);
// PID is per container because of TARGET (ephemeral containers) and is taken from the
// container's options, falling back to the pod's.
type nsModes struct {
	network, ipc, pid runtime.NamespaceMode
}

func namespaceModes(cfg *runtime.ContainerConfig, pod *runtime.PodSandboxConfig) nsModes {
	podNS := pod.GetLinux().GetSecurityContext().GetNamespaceOptions()
	ctrNS := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	shared := podNS
	if shared == nil {
		shared = ctrNS
	}
	pidNS := ctrNS
	if pidNS == nil {
		pidNS = podNS
	}
	return nsModes{network: shared.GetNetwork(), ipc: shared.GetIpc(), pid: pidNS.GetPid()}
}

// namespaces builds the container's namespace list. The container joins the pod's
// network namespace (the pinned NetNSPath) and the pause process's IPC and UTS
// namespaces, unless the pod uses the host's (then the entry is left out, which means
// the host's). PID: POD joins the pause's, CONTAINER gets a new one, NODE the host's,
// TARGET the target container's. Mount is always new; cgroup is new on cgroup v2 for
// containers that are not privileged (containerd: privileged containers and v1 hosts
// keep the host's, kubernetes/enhancements cgroups-v2 KEP).
func namespaces(in Input, modes nsModes, privileged bool) ([]specs.LinuxNamespace, error) {
	pausePath := func(ns string) (string, error) {
		if in.PausePid <= 0 {
			return "", invalidf("the pod's pause pid is needed to join its %s namespace", ns)
		}
		return fmt.Sprintf("/proc/%d/ns/%s", in.PausePid, ns), nil
	}
	var out []specs.LinuxNamespace
	switch modes.network {
	case runtime.NamespaceMode_NODE:
		if in.NetNSPath != "" {
			return nil, invalidf("the pod uses the host network but a network namespace %q was given", in.NetNSPath)
		}
	case runtime.NamespaceMode_POD:
		// An empty path would silently put the container on the host network.
		if in.NetNSPath == "" {
			return nil, invalidf("the pod has its own network namespace but no path to it was given")
		}
		out = append(out, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: in.NetNSPath})
	default:
		return nil, invalidf("network namespace mode %s is not supported (POD or NODE)", modes.network)
	}
	switch modes.ipc {
	case runtime.NamespaceMode_NODE:
	case runtime.NamespaceMode_POD:
		p, err := pausePath("ipc")
		if err != nil {
			return nil, err
		}
		out = append(out, specs.LinuxNamespace{Type: specs.IPCNamespace, Path: p})
	default:
		return nil, invalidf("ipc namespace mode %s is not supported (POD or NODE)", modes.ipc)
	}
	// UTS follows the network: a host-network pod has the node's hostname.
	if modes.network != runtime.NamespaceMode_NODE {
		p, err := pausePath("uts")
		if err != nil {
			return nil, err
		}
		out = append(out, specs.LinuxNamespace{Type: specs.UTSNamespace, Path: p})
	}
	switch modes.pid {
	case runtime.NamespaceMode_POD:
		p, err := pausePath("pid")
		if err != nil {
			return nil, err
		}
		out = append(out, specs.LinuxNamespace{Type: specs.PIDNamespace, Path: p})
	case runtime.NamespaceMode_CONTAINER:
		out = append(out, specs.LinuxNamespace{Type: specs.PIDNamespace})
	case runtime.NamespaceMode_NODE:
	case runtime.NamespaceMode_TARGET:
		if in.TargetPid <= 0 {
			return nil, invalidf("pid namespace mode TARGET needs the target container's pid: is container %q running?",
				in.Config.GetLinux().GetSecurityContext().GetNamespaceOptions().GetTargetId())
		}
		out = append(out, specs.LinuxNamespace{Type: specs.PIDNamespace, Path: fmt.Sprintf("/proc/%d/ns/pid", in.TargetPid)})
	default:
		return nil, invalidf("pid namespace mode %d is not supported", modes.pid)
	}
	out = append(out, specs.LinuxNamespace{Type: specs.MountNamespace})
	if cgroup2() && !privileged {
		out = append(out, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	}
	return out, nil
}
