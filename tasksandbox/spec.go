package tasksandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	criann "github.com/crisp-runtime/crisp/api/annotations"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/selinux/go-selinux"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	options "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/protofields"
)

// pauseUID is the user the pause container runs as: registry.k8s.io/pause's, which
// needs no privilege to wait for signals.
const pauseUID = 65535

// pausePath is where crisp's shim binary appears in the pause container, whose rootfs
// holds nothing else. The binary is static, and its C constructor runs the pause loop
// before the Go runtime starts when _CRISP_PAUSE=oci (see pkg/shimkit/pause/pause.c).
const pausePath = "/pause"

// IsRuncShim reports whether a shim takes containerd.runc.v1.Options, judged by its
// name as containerd judges by runtime_type io.containerd.runc.v2.
func IsRuncShim(shim string) bool {
	return strings.Contains(filepath.Base(shim), "runc")
}

// RuntimeOptions encodes a handler's [runtimes.NAME.options] table as the options
// containerd would send its shim: containerd.runc.v1.Options for a runc shim,
// runtimeoptions.v1.Options (TypeUrl, ConfigPath, ConfigBody: gVisor, Kata) for any
// other. Keys match a field by its Go or proto name, case and underscores aside.
// stateDir gives a runc shim's Root a default of crisp's own, not containerd's.
func RuntimeOptions(name string, rt config.Runtime, stateDir string, systemd bool) (*anypb.Any, error) {
	var msg proto.Message = &runtimeoptions.Options{}
	if IsRuncShim(rt.Shim) {
		// The cgroup driver follows criserver's, which kubelet's must match.
		msg = &runcoptions.Options{Root: filepath.Join(stateDir, "runc"), SystemdCgroup: systemd}
	}
	if err := protofields.Set(msg.ProtoReflect(), rt.Options); err != nil {
		return nil, fmt.Errorf("runtimes.%s.options: %w", name, err)
	}
	data, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("runtimes.%s.options: %w", name, err)
	}
	// containerd's typeurl names a message by its full name alone.
	return &anypb.Any{TypeUrl: string(msg.ProtoReflect().Descriptor().FullName()), Value: data}, nil
}

// PauseBundle is what the pause container of a task-only shim's pod is made of.
type PauseBundle struct {
	// ID, Name, Namespace and UID are the pod's.
	ID, Name, Namespace, UID string
	// NetNS is the pod's network namespace; "" for the host's network.
	NetNS string
	// Binary is crisp's shim binary, mounted at pausePath.
	Binary      string
	CgroupsPath string
	Annotations map[string]string
	Options     *options.SandboxOptions
}

// spec is the pause container's OCI spec: the pod's namespaces, hostname, sysctls and
// cgroup, and a process that only waits. Pods with a user namespace are refused: the
// ID mappings would have to be set up as crisp's own shim does, which no task API
// request carries.
func (p PauseBundle) spec() (*specs.Spec, error) {
	o := p.Options
	if o.GetUserns() != nil {
		return nil, fmt.Errorf("pod %s asks for a user namespace, which crisp does not set up through a task-only shim: %w", p.ID, errdefs.ErrNotImplemented)
	}
	nss := []specs.LinuxNamespace{{Type: specs.MountNamespace}}
	if p.NetNS != "" {
		nss = append(nss, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: p.NetNS})
	}
	for _, ns := range []struct {
		mode options.NamespaceMode
		typ  specs.LinuxNamespaceType
	}{{o.GetPid(), specs.PIDNamespace}, {o.GetIpc(), specs.IPCNamespace}, {o.GetUts(), specs.UTSNamespace}} {
		if ns.mode != options.NamespaceMode_NODE {
			nss = append(nss, specs.LinuxNamespace{Type: ns.typ})
		}
	}
	hostname := o.GetHostname()
	if o.GetUts() == options.NamespaceMode_NODE {
		hostname = ""
	}
	annotations := map[string]string{}
	for k, v := range p.Annotations {
		annotations[k] = v
	}
	annotations[criann.ContainerType] = criann.ContainerTypeSandbox
	annotations[criann.SandboxID] = p.ID
	annotations[criann.SandboxName] = p.Name
	annotations[criann.SandboxNamespace] = p.Namespace
	annotations[criann.SandboxUID] = p.UID
	oom := int(o.GetOomScoreAdj())
	shares := uint64(2)
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args:            []string{pausePath},
			Env:             []string{"_CRISP_PAUSE=oci"},
			Cwd:             "/",
			User:            specs.User{UID: pauseUID, GID: pauseUID},
			NoNewPrivileges: true,
			Capabilities:    &specs.LinuxCapabilities{},
			OOMScoreAdj:     &oom,
			// The pod's SELinux labels, as containerd puts them in its pause's spec,
			// when the pause binary may enter the pod's type (see pauseLabel).
			SelinuxLabel: p.pauseLabel(),
		},
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: hostname,
		Mounts: []specs.Mount{
			{Destination: pausePath, Type: "bind", Source: p.Binary, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
			// runc's init reads /proc (cap_last_cap) after entering the rootfs.
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		},
		Annotations: annotations,
		Linux: &specs.Linux{
			Namespaces:  nss,
			Sysctl:      o.GetSysctls(),
			CgroupsPath: p.CgroupsPath,
			MountLabel:  o.GetMountLabel(),
			// CPU shares 2, as containerd gives its pause: it must not weigh in the
			// pod's share of the CPU (runc converts shares to a v2 weight).
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				CPU:     &specs.LinuxCPU{Shares: &shares},
			},
			MaskedPaths:   []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}, nil
}

// pauseLabel is the pause's process label: the pod's, when the pause binary carries
// the pod's file type (the only type the container policies let the container type
// enter; containerd's pause comes from an image mounted with that type); else none,
// so that the pause keeps the shim's domain instead of failing to start.
func (p PauseBundle) pauseLabel() string {
	o := p.Options
	if o.GetSelinuxLabel() == "" {
		return ""
	}
	l, err := selinux.FileLabel(p.Binary)
	if err != nil {
		return ""
	}
	f, ferr := selinux.NewContext(l)
	m, merr := selinux.NewContext(o.GetMountLabel())
	if ferr != nil || merr != nil || f["type"] == "" || f["type"] != m["type"] {
		return ""
	}
	return o.GetSelinuxLabel()
}

// Write puts config.json and an empty rootfs into bundle.
func (p PauseBundle) Write(bundle string) error {
	s, err := p.spec()
	if err != nil {
		return err
	}
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode pause spec of pod %s: %w", p.ID, err)
	}
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o711); err != nil {
		return fmt.Errorf("create pause rootfs of pod %s: %w", p.ID, err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return fmt.Errorf("write pause spec of pod %s: %w", p.ID, err)
	}
	return nil
}

// RaisePauseOOMScore raises the pause container's oom_score_adj to its shim's own when
// it asks for less: runc writes it from the shim's process tree, and lowering a score
// needs CAP_SYS_RESOURCE (crisp's own shim clamps it the same way). The shim is
// started by then; it reads the spec again at task Create.
func RaisePauseOOMScore(bundle string, shimPid int) error {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", shimPid))
	if err != nil {
		return nil // the shim is gone: Create fails anyway
	}
	floor, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return nil
	}
	path := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read pause spec: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("decode pause spec: %w", err)
	}
	if s.Process == nil || s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj >= floor {
		return nil
	}
	s.Process.OOMScoreAdj = &floor
	if raw, err = json.Marshal(&s); err != nil {
		return fmt.Errorf("encode pause spec: %w", err)
	}
	return os.WriteFile(path, raw, 0o600)
}
