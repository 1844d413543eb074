package pod

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"

	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/podfiles"
	"github.com/crisp-runtime/crisp/pkg/shimkit/pause"
)

// podSpec is the validated form of a CreateSandboxRequest.
type podSpec struct {
	id        string
	netnsPath string // "" keeps the host network namespace
	hostname  string
	sysctls   map[string]string
	newIPC    bool
	newUTS    bool
	newPID    bool
	// newNet: the pause process makes the pod's network namespace itself, inside the
	// pod's user namespace (userns pods only).
	newNet bool
	// userns is the pod's user namespace mapping; nil keeps the host's.
	userns *pause.IDMap
	// joinUserNS: the pod's user namespace already exists, as the owner of the netns
	// at netnsPath (containerd makes it so); the pause process joins it instead of
	// creating one.
	joinUserNS bool
	cgroup     CgroupConfig
	oomScore   int
	// selinuxLabel is the label the pause process takes ("" keeps the shim's). The
	// pod's file label (mount_label) is for task-only shims' pause containers: this
	// shim mounts nothing for the pod.
	selinuxLabel string
	modes        string // for status info: "network=pod,pid=pod,..."
}

const (
	defaultCgroupParent = "/crisp"
	defaultSystemdSlice = "system.slice"
	cgroupPrefix        = "crisp"
	maxHostname         = 64 // HOST_NAME_MAX
)

func invalid(format string, args ...any) error {
	return kindf(errdefs.ErrInvalidArgument, format, args...)
}

// messageKind is an errdefs kind that takes a message of its own.
type messageKind interface{ WithMessage(string) error }

// kindf is an error of kind whose text is the formatted message alone: the shim's
// ttrpc server turns the kind into the gRPC code (task.GRPCStatus), and fmt.Errorf's
// "%w" would append the kind's name to the message the wire has always carried.
func kindf(kind messageKind, format string, args ...any) error {
	return kind.WithMessage(fmt.Sprintf(format, args...))
}

// ValidID reports whether id can name a sandbox: it becomes part of cgroup and unit names.
func ValidID(id string) bool { return validSandboxID(id) }

// unpackOptions decodes the options Any into SandboxOptions, the one form buildSpec
// validates: crisp's controller sends SandboxOptions, containerd ≥ 2.0's shim
// sandboxer the CRI PodSandboxConfig (see optionsFromPodConfig). Absent options mean
// all-default (every namespace per pod, cgroupfs under /crisp). The pod's files come
// back, to be written by the shim, only with a PodSandboxConfig: crisp's controller
// writes its own.
func unpackOptions(a *anypb.Any) (*optionsv1.SandboxOptions, *podfiles.Pod, error) {
	opts := &optionsv1.SandboxOptions{}
	if a == nil {
		return opts, nil, nil
	}
	if isPodSandboxConfig(a.GetTypeUrl()) {
		return optionsFromPodConfig(a.GetValue())
	}
	if !a.MessageIs(opts) {
		return nil, nil, invalid("options must be %s or %s, got %q", opts.ProtoReflect().Descriptor().FullName(), podSandboxConfigName, a.GetTypeUrl())
	}
	if err := a.UnmarshalTo(opts); err != nil {
		return nil, nil, invalid("decode options: %v", err)
	}
	return opts, nil, nil
}

// buildSpec validates everything the pause process and the cgroup manager will act on,
// so that a bad request fails as InvalidArgument before anything is created.
func buildSpec(id, netnsPath string, o *optionsv1.SandboxOptions) (podSpec, error) {
	spec := podSpec{id: id, netnsPath: netnsPath, sysctls: map[string]string{}}
	if !ValidID(id) {
		return spec, invalid("sandbox id %q: want 1-128 characters of [A-Za-z0-9_.-]", id)
	}
	for name, m := range map[string]optionsv1.NamespaceMode{
		"network": o.GetNetwork(), "pid": o.GetPid(), "ipc": o.GetIpc(), "uts": o.GetUts(),
	} {
		if _, ok := optionsv1.NamespaceMode_name[int32(m)]; !ok {
			return spec, invalid("%s namespace mode %d is not POD, CONTAINER or NODE", name, m)
		}
		// Only a PID namespace can sensibly differ per container; the others are the
		// pod's by definition of a pod.
		if m == optionsv1.NamespaceMode_CONTAINER && name != "pid" {
			return spec, invalid("%s namespace mode CONTAINER is not supported", name)
		}
	}
	if u := o.GetUserns(); u != nil {
		m, err := checkUserNS(u, netnsPath, o)
		if err != nil {
			return spec, err
		}
		spec.userns = &m
		spec.joinUserNS = netnsPath != ""
		spec.newNet = !spec.joinUserNS && o.GetNetwork() != optionsv1.NamespaceMode_NODE
	}
	spec.newIPC = o.GetIpc() != optionsv1.NamespaceMode_NODE
	spec.newUTS = o.GetUts() != optionsv1.NamespaceMode_NODE
	spec.newPID = o.GetPid() != optionsv1.NamespaceMode_NODE
	// Without a netns path the pod stays in the host network, whatever the mode says.
	network := "node"
	if netnsPath != "" || spec.newNet {
		network = "pod"
	}
	spec.modes = fmt.Sprintf("network=%s,pid=%s,ipc=%s,uts=%s", network,
		strings.ToLower(o.GetPid().String()), strings.ToLower(o.GetIpc().String()), strings.ToLower(o.GetUts().String()))

	if netnsPath != "" {
		if o.GetNetwork() == optionsv1.NamespaceMode_NODE {
			return spec, invalid("netns_path %q given with network mode NODE", netnsPath)
		}
		if err := checkNetNS(netnsPath); err != nil {
			return spec, err
		}
	}

	if h := o.GetHostname(); h != "" {
		if !spec.newUTS {
			return spec, invalid("hostname %q needs uts mode POD: with NODE it would rename the host", h)
		}
		if len(h) > maxHostname || !validHostname(h) {
			return spec, invalid("hostname %q: want at most %d characters of [A-Za-z0-9.-]", h, maxHostname)
		}
		spec.hostname = h
	}

	for k, v := range o.GetSysctls() {
		if err := checkSysctl(k, v, netnsPath != "" || spec.newNet, spec.newIPC, spec.newUTS); err != nil {
			return spec, err
		}
		spec.sysctls[k] = v
	}

	cg, err := cgroupConfig(id, o.GetCgroupParent(), o.GetSystemdCgroup())
	if err != nil {
		return spec, err
	}
	spec.cgroup = cg

	if s := o.GetOomScoreAdj(); s < -1000 || s > 1000 {
		return spec, invalid("oom_score_adj %d out of range [-1000, 1000]", s)
	}
	spec.oomScore = int(o.GetOomScoreAdj())
	spec.selinuxLabel = o.GetSelinuxLabel()
	return spec, nil
}

// checkNetNS makes sure the path is a network namespace, so that a typo fails here and
// not as an obscure setns error in the pause process.
func checkNetNS(path string) error {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return invalid("netns_path %q must be an absolute, clean path", path)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return invalid("netns_path %q: %v", path, err)
	}
	defer unix.Close(fd)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return invalid("netns_path %q: statfs: %v", path, err)
	}
	if fs.Type != unix.NSFS_MAGIC {
		return invalid("netns_path %q is not a namespace file (bind-mounted nsfs)", path)
	}
	typ, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil {
		return invalid("netns_path %q: NS_GET_NSTYPE: %v", path, err)
	}
	if typ != unix.CLONE_NEWNET {
		return invalid("netns_path %q is not a network namespace", path)
	}
	return nil
}

// sysctlNamespace names the namespace a sysctl belongs to ("" if it is global). Only
// namespaced sysctls can be set per pod: anything else would change the host.
func sysctlNamespace(key string) string {
	switch {
	case strings.HasPrefix(key, "net."):
		return "network"
	case strings.HasPrefix(key, "kernel.shm"), strings.HasPrefix(key, "kernel.msg"),
		strings.HasPrefix(key, "kernel.sem"), strings.HasPrefix(key, "fs.mqueue."):
		return "ipc"
	case key == "kernel.hostname", key == "kernel.domainname":
		return "uts"
	}
	return ""
}

func checkSysctl(k, v string, ownNet, ownIPC, ownUTS bool) error {
	if strings.Contains(k, "..") || strings.Contains(k, "/") {
		return invalid("sysctl %q: key must not contain \"..\" or \"/\"", k)
	}
	if len(k) > 256 || !validSysctlName(k) {
		return invalid("sysctl %q: malformed key", k)
	}
	if v == "" || len(v) > 4096 || strings.ContainsAny(v, "\n\x00") {
		return invalid("sysctl %q: value must be 1-4096 bytes without newlines", k)
	}
	switch ns := sysctlNamespace(k); ns {
	case "network":
		if !ownNet {
			return invalid("sysctl %q needs the pod's own network namespace (netns_path is empty)", k)
		}
	case "ipc":
		if !ownIPC {
			return invalid("sysctl %q needs ipc mode POD", k)
		}
	case "uts":
		if !ownUTS {
			return invalid("sysctl %q needs uts mode POD", k)
		}
	default:
		return invalid("sysctl %q is not namespaced: setting it would change the host", k)
	}
	return nil
}

// checkUserNS validates a pod's user namespace as the pause process will create or
// join it: one uid and one gid range that map container id 0 and fit in 32 bits
// (criserver checked the CRI request already; the shim is also driven by other
// callers). The pod's network, IPC, UTS and PID namespaces all belong to it, so none
// may be the host's, but for a pod on the host network, which keeps the host's network
// and UTS namespaces. Without a netns path the pause process creates the user namespace
// and the network namespace inside it (crisp's controller). With one, the network
// namespace must already belong to a user namespace other than the host's, which the
// pause process joins (containerd ≥ 2.0 creates a user-namespaced pod's netns inside a
// user namespace with the pod's mappings, and joins that, as its podsandbox pins it);
// a netns of the host's user namespace would leave the pod's root unable to mount
// sysfs or change its own network settings.
func checkUserNS(u *optionsv1.UserNamespace, netnsPath string, o *optionsv1.SandboxOptions) (pause.IDMap, error) {
	var m pause.IDMap
	if len(u.GetUids()) != 1 || len(u.GetGids()) != 1 {
		return m, invalid("user namespace: want exactly one uid and one gid mapping, got %d and %d", len(u.GetUids()), len(u.GetGids()))
	}
	for kind, r := range map[string]*optionsv1.IDMapping{"uid": u.GetUids()[0], "gid": u.GetGids()[0]} {
		if r.GetSize() == 0 || r.GetContainerId() != 0 || uint64(r.GetHostId())+uint64(r.GetSize()) > 1<<32-1 {
			return m, invalid("user namespace %s mapping %d:%d:%d: want container id 0, a length > 0 and host ids below 2^32-1",
				kind, r.GetContainerId(), r.GetHostId(), r.GetSize())
		}
	}
	if netnsPath != "" {
		if err := checkNetNS(netnsPath); err != nil {
			return m, err
		}
		if own, err := netnsOfOwnUserNS(netnsPath); err != nil {
			return m, err
		} else if own {
			return m, invalid("netns_path %q given for a pod with a user namespace belongs to the host's user namespace: "+
				"create it inside the pod's user namespace (as containerd does), or give none and the pause process creates it", netnsPath)
		}
	}
	// A pod on the host network (containerd ≥ 2.0 runs those with a user namespace
	// too) keeps the host's network and UTS namespaces, which stay the host user
	// namespace's; its IPC and PID namespaces are its own.
	hostNet := o.GetNetwork() == optionsv1.NamespaceMode_NODE
	if hostNet && netnsPath != "" {
		return m, invalid("netns_path %q given with network mode NODE", netnsPath)
	}
	for name, mode := range map[string]optionsv1.NamespaceMode{"ipc": o.GetIpc(), "uts": o.GetUts(), "pid": o.GetPid()} {
		if mode == optionsv1.NamespaceMode_NODE && !(name == "uts" && hostNet) {
			return m, invalid("%s namespace mode NODE is not possible with a user namespace", name)
		}
	}
	m.UID = pause.Range{HostID: u.GetUids()[0].GetHostId(), Size: u.GetUids()[0].GetSize()}
	m.GID = pause.Range{HostID: u.GetGids()[0].GetHostId(), Size: u.GetGids()[0].GetSize()}
	return m, nil
}

// netnsOfOwnUserNS reports whether the network namespace at path belongs to the
// shim's own user namespace.
func netnsOfOwnUserNS(path string) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, invalid("netns_path %q: %v", path, err)
	}
	defer unix.Close(fd)
	owner, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	if err != nil {
		return false, invalid("netns_path %q: NS_GET_USERNS: %v", path, err)
	}
	defer unix.Close(owner)
	var o, self unix.Stat_t
	if err := unix.Fstat(owner, &o); err != nil {
		return false, kindf(errdefs.ErrInternal, "netns_path %q: stat its user namespace: %v", path, err)
	}
	if err := unix.Stat("/proc/self/ns/user", &self); err != nil {
		return false, kindf(errdefs.ErrInternal, "stat own user namespace: %v", err)
	}
	return o.Dev == self.Dev && o.Ino == self.Ino, nil
}

// checkIDMaps checks that process pid's user namespace maps exactly want.
func checkIDMaps(pid int, want pause.IDMap) error {
	for _, f := range []struct {
		file string
		r    pause.Range
	}{{"uid_map", want.UID}, {"gid_map", want.GID}} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f.file))
		if err != nil {
			return fmt.Errorf("cannot be read: %v", err)
		}
		got := strings.Join(strings.Fields(string(data)), " ")
		if exp := fmt.Sprintf("0 %d %d", f.r.HostID, f.r.Size); got != exp {
			return fmt.Errorf("has %s %q, the pod asks for %q", f.file, got, exp)
		}
	}
	return nil
}
