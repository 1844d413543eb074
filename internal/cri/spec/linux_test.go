package spec

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	criann "github.com/crisp-runtime/crisp/api/annotations"
)

func TestDevices(t *testing.T) {
	setHost(t, defaultHost())
	var nullInfo specs.LinuxDevice
	if d, err := deviceFromPath("/dev/null"); err != nil {
		t.Skipf("no /dev/null device here: %v", err)
	} else {
		nullInfo = d
	}
	dir := t.TempDir()
	link := filepath.Join(dir, "null-link")
	if err := os.Symlink("/dev/null", link); err != nil {
		t.Fatal(err)
	}
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}

	in := baseInput(t)
	in.Config.Devices = []*runtime.Device{
		{ContainerPath: "/dev/mynull", HostPath: link, Permissions: "rw"},
		{ContainerPath: "/dev/other", HostPath: "/dev/null"},
	}
	res := mustGenerate(t, in)
	if len(res.Spec.Linux.Devices) != 2 {
		t.Fatalf("devices %+v", res.Spec.Linux.Devices)
	}
	d := res.Spec.Linux.Devices[0]
	if d.Path != "/dev/mynull" || d.Type != "c" || d.Major != 1 || d.Minor != 3 || *d.UID != *nullInfo.UID || *d.FileMode != *nullInfo.FileMode {
		t.Errorf("device %+v", d)
	}
	rules := res.Spec.Linux.Resources.Devices
	if len(rules) != 3 || rules[0].Allow || rules[0].Access != "rwm" {
		t.Fatalf("rules %+v: want deny-all first", rules)
	}
	if !rules[1].Allow || rules[1].Type != "c" || *rules[1].Major != 1 || *rules[1].Minor != 3 || rules[1].Access != "rw" {
		t.Errorf("rule %+v", rules[1])
	}
	equal(t, "default permissions", rules[2].Access, "rwm")

	for _, tc := range []struct {
		name string
		dev  *runtime.Device
		want string
	}{
		{"regular file", &runtime.Device{ContainerPath: "/dev/x", HostPath: regular}, "is not a character or block device"},
		{"missing", &runtime.Device{ContainerPath: "/dev/x", HostPath: filepath.Join(dir, "nope")}, "does not exist on the host"},
		{"empty dir", &runtime.Device{ContainerPath: "/dev/x", HostPath: empty}, "is not a device node and holds none"},
		{"bad permissions", &runtime.Device{ContainerPath: "/dev/x", HostPath: "/dev/null", Permissions: "rwx"}, `permissions "rwx"`},
		{"relative container path", &runtime.Device{ContainerPath: "x", HostPath: "/dev/null"}, `container_path "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			in.Config.Devices = []*runtime.Device{tc.dev}
			_, err := Generate(in)
			wantErr(t, err, isInvalid, tc.want)
		})
	}

	// Privileged: every host device (a CRI device keeps its path) and allow-all.
	in = baseInput(t)
	in.Pod.Linux.SecurityContext.Privileged = true
	sc(in).Privileged = true
	in.Config.Devices = []*runtime.Device{{ContainerPath: "/dev/null", HostPath: "/dev/null", Permissions: "r"}}
	res = mustGenerate(t, in)
	var paths []string
	for _, d := range res.Spec.Linux.Devices {
		paths = append(paths, d.Path)
	}
	equal(t, "privileged devices", paths, []string{"/dev/null", "/dev/sda"})
	equal(t, "privileged rules", res.Spec.Linux.Resources.Devices, []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}})
}

func TestNamespaces(t *testing.T) {
	ns := func(typ specs.LinuxNamespaceType, p string) specs.LinuxNamespace {
		return specs.LinuxNamespace{Type: typ, Path: p}
	}
	for _, tc := range []struct {
		name                string
		network, ipc, pid   runtime.NamespaceMode
		netns               string
		targetPid           int
		cgroup2, privileged bool
		want                []specs.LinuxNamespace
		wantErr             string
	}{
		{
			name: "pid CONTAINER", pid: runtime.NamespaceMode_CONTAINER, netns: "/run/netns/p",
			want: []specs.LinuxNamespace{ns("network", "/run/netns/p"), ns("ipc", "/proc/100/ns/ipc"), ns("uts", "/proc/100/ns/uts"), ns("pid", ""), ns("mount", "")},
		},
		{
			name: "pid POD joins the pause", pid: runtime.NamespaceMode_POD, netns: "/run/netns/p",
			want: []specs.LinuxNamespace{ns("network", "/run/netns/p"), ns("ipc", "/proc/100/ns/ipc"), ns("uts", "/proc/100/ns/uts"), ns("pid", "/proc/100/ns/pid"), ns("mount", "")},
		},
		{
			name: "pid NODE is the host's", pid: runtime.NamespaceMode_NODE, netns: "/run/netns/p",
			want: []specs.LinuxNamespace{ns("network", "/run/netns/p"), ns("ipc", "/proc/100/ns/ipc"), ns("uts", "/proc/100/ns/uts"), ns("mount", "")},
		},
		{
			name: "pid TARGET joins the target", pid: runtime.NamespaceMode_TARGET, targetPid: 4242, netns: "/run/netns/p",
			want: []specs.LinuxNamespace{ns("network", "/run/netns/p"), ns("ipc", "/proc/100/ns/ipc"), ns("uts", "/proc/100/ns/uts"), ns("pid", "/proc/4242/ns/pid"), ns("mount", "")},
		},
		{
			name: "pid TARGET without a target pid", pid: runtime.NamespaceMode_TARGET, netns: "/run/netns/p",
			wantErr: "TARGET needs the target container's pid",
		},
		{
			name: "host network: no network or uts namespace", network: runtime.NamespaceMode_NODE, pid: runtime.NamespaceMode_CONTAINER,
			want: []specs.LinuxNamespace{ns("ipc", "/proc/100/ns/ipc"), ns("pid", ""), ns("mount", "")},
		},
		{
			name: "host ipc", ipc: runtime.NamespaceMode_NODE, pid: runtime.NamespaceMode_CONTAINER, netns: "/run/netns/p",
			want: []specs.LinuxNamespace{ns("network", "/run/netns/p"), ns("uts", "/proc/100/ns/uts"), ns("pid", ""), ns("mount", "")},
		},
		{
			name: "all host", network: runtime.NamespaceMode_NODE, ipc: runtime.NamespaceMode_NODE, pid: runtime.NamespaceMode_NODE,
			want: []specs.LinuxNamespace{ns("mount", "")},
		},
		{
			name: "cgroup v2 adds a cgroup namespace", pid: runtime.NamespaceMode_CONTAINER, netns: "/run/netns/p", cgroup2: true,
			want: []specs.LinuxNamespace{ns("network", "/run/netns/p"), ns("ipc", "/proc/100/ns/ipc"), ns("uts", "/proc/100/ns/uts"), ns("pid", ""), ns("mount", ""), ns("cgroup", "")},
		},
		{
			name: "cgroup v2 privileged keeps the host's", pid: runtime.NamespaceMode_CONTAINER, netns: "/run/netns/p", cgroup2: true, privileged: true,
			want: []specs.LinuxNamespace{ns("network", "/run/netns/p"), ns("ipc", "/proc/100/ns/ipc"), ns("uts", "/proc/100/ns/uts"), ns("pid", ""), ns("mount", "")},
		},
		{
			name: "pod network without a netns path", pid: runtime.NamespaceMode_CONTAINER,
			wantErr: "no path to it was given",
		},
		{
			name: "host network with a netns path", network: runtime.NamespaceMode_NODE, pid: runtime.NamespaceMode_CONTAINER, netns: "/run/netns/p",
			wantErr: "uses the host network but a network namespace",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := defaultHost()
			h.cgroup2 = tc.cgroup2
			setHost(t, h)
			in := baseInput(t)
			in.NetNSPath, in.TargetPid = tc.netns, tc.targetPid
			podNS := in.Pod.Linux.SecurityContext.NamespaceOptions
			podNS.Network, podNS.Ipc = tc.network, tc.ipc
			ctrNS := sc(in).NamespaceOptions
			ctrNS.Network, ctrNS.Ipc, ctrNS.Pid = tc.network, tc.ipc, tc.pid
			if tc.pid == runtime.NamespaceMode_TARGET {
				ctrNS.TargetId = "target"
			} else {
				podNS.Pid = tc.pid
			}
			if tc.privileged {
				in.Pod.Linux.SecurityContext.Privileged = true
				sc(in).Privileged = true
			}
			if tc.wantErr != "" {
				_, err := Generate(in)
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			equal(t, "namespaces", mustGenerate(t, in).Spec.Linux.Namespaces, tc.want)
		})
	}

	setHost(t, defaultHost())
	in := baseInput(t)
	in.PausePid = 0
	_, err := Generate(in)
	wantErr(t, err, isInvalid, "pause pid is needed")

	in = baseInput(t)
	sc(in).NamespaceOptions.UsernsOptions = &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD}
	_, err = Generate(in)
	wantErr(t, err, isInvalid, "exactly one uid mapping")
	sc(in).NamespaceOptions.UsernsOptions = &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE}
	mustGenerate(t, in)
}

func TestCgroupsPath(t *testing.T) {
	setHost(t, defaultHost())
	for _, tc := range []struct {
		parent  string
		systemd bool
		want    string
		wantErr string
	}{
		{parent: "", want: "/crisp/crisp-c1"},
		{parent: "/kubepods/burstable/pod123", want: "/kubepods/burstable/pod123/crisp-c1"},
		{parent: "", systemd: true, want: "system.slice:crisp:c1"},
		{parent: "kubepods-burstable-pod123.slice", systemd: true, want: "kubepods-burstable-pod123.slice:crisp:c1"},
		{parent: "/kubepods/../x", wantErr: "absolute, clean path"},
		{parent: "relative", wantErr: "absolute, clean path"},
		{parent: "/kubepods", systemd: true, wantErr: "wants a slice name"},
	} {
		in := baseInput(t)
		in.CgroupParent, in.SystemdCgroup = tc.parent, tc.systemd
		if tc.wantErr != "" {
			_, err := Generate(in)
			wantErr(t, err, isInvalid, tc.wantErr)
			continue
		}
		equal(t, "cgroups path "+tc.parent, mustGenerate(t, in).Spec.Linux.CgroupsPath, tc.want)
	}
}

func TestCapabilities(t *testing.T) {
	setHost(t, defaultHost())
	all := defaultHost().caps
	for _, tc := range []struct {
		name        string
		add, drop   []string
		ambient     []string
		privileged  bool
		want        []string
		wantAmbient []string
		wantErr     string
	}{
		{name: "default set", want: defaultCapabilities},
		{name: "add with and without prefix, any case", add: []string{"NET_ADMIN", "CAP_SYS_PTRACE", "sys_time"},
			want: append(slices.Clone(defaultCapabilities), "CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_TIME")},
		{name: "drop", drop: []string{"CHOWN", "CAP_KILL", "NET_RAW"},
			want: slices.DeleteFunc(slices.Clone(defaultCapabilities), func(c string) bool {
				return c == "CAP_CHOWN" || c == "CAP_KILL" || c == "CAP_NET_RAW"
			})},
		{name: "drop ALL add one", drop: []string{"ALL"}, add: []string{"NET_BIND_SERVICE"}, want: []string{"CAP_NET_BIND_SERVICE"}},
		{name: "add ALL drop one", add: []string{"all"}, drop: []string{"SYS_ADMIN"},
			want: slices.DeleteFunc(slices.Clone(all), func(c string) bool { return c == "CAP_SYS_ADMIN" })},
		{name: "add ALL and drop ALL", add: []string{"ALL"}, drop: []string{"ALL"}, want: nil},
		{name: "privileged gets all, drops do not apply", privileged: true, drop: []string{"ALL"}, want: all},
		{name: "ambient joins every set", drop: []string{"ALL"}, ambient: []string{"NET_BIND_SERVICE"},
			want: []string{"CAP_NET_BIND_SERVICE"}, wantAmbient: []string{"CAP_NET_BIND_SERVICE"}},
		{name: "unknown capability", add: []string{"FLY"}, wantErr: `unknown capability "FLY"`},
		{name: "unknown dropped capability", drop: []string{"CAP_NOPE"}, wantErr: `unknown capability "CAP_NOPE"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			sc(in).Capabilities = &runtime.Capability{AddCapabilities: tc.add, DropCapabilities: tc.drop, AddAmbientCapabilities: tc.ambient}
			if tc.privileged {
				in.Pod.Linux.SecurityContext.Privileged = true
				sc(in).Privileged = true
			}
			if tc.wantErr != "" {
				_, err := Generate(in)
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			c := mustGenerate(t, in).Spec.Process.Capabilities
			for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted} {
				equal(t, "capabilities", set, tc.want)
			}
			equal(t, "ambient", c.Ambient, tc.wantAmbient)
			equal(t, "inheritable", c.Inheritable, tc.wantAmbient)
		})
	}
}

func TestPrivilegedNeedsPrivilegedPod(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	sc(in).Privileged = true
	_, err := Generate(in)
	wantErr(t, err, isInvalid, `privileged container "app" is not allowed in a pod that is not privileged`)
}

func TestSecurityBasics(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	res := mustGenerate(t, in)
	if res.Spec.Process.NoNewPrivileges || res.Spec.Root.Readonly {
		t.Errorf("defaults: no_new_privileges %v, readonly root %v", res.Spec.Process.NoNewPrivileges, res.Spec.Root.Readonly)
	}
	sc(in).NoNewPrivs, sc(in).ReadonlyRootfs = true, true
	sc(in).SelinuxOptions = &runtime.SELinuxOption{Type: "spc_t"}
	res = mustGenerate(t, in)
	if !res.Spec.Process.NoNewPrivileges || !res.Spec.Root.Readonly {
		t.Errorf("no_new_privileges %v, readonly root %v", res.Spec.Process.NoNewPrivileges, res.Spec.Root.Readonly)
	}
	if res.Spec.Process.ApparmorProfile != "" || res.Spec.Process.SelinuxLabel != "" {
		t.Errorf("apparmor %q selinux %q: want none", res.Spec.Process.ApparmorProfile, res.Spec.Process.SelinuxLabel)
	}
	if len(res.Warnings) != 1 {
		t.Errorf("warnings %q: want SELinux's", res.Warnings)
	}
	// CDI devices: TestCDIDevices.
}

func TestSeccomp(t *testing.T) {
	setHost(t, defaultHost())
	profile := filepath.Join(t.TempDir(), "profile.json")
	if err := os.WriteFile(profile, []byte(`{"defaultAction":"SCMP_ACT_LOG","syscalls":[{"names":["mkdir"],"action":"SCMP_ACT_ERRNO"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"defaultAction":`), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.json")
	type want int
	const (
		none want = iota
		runtimeDefault
		localhost
	)
	for _, tc := range []struct {
		name       string
		profile    *runtime.SecurityProfile
		path       string
		privileged bool
		want       want
		wantWarn   bool
		wantErr    string
	}{
		{name: "nothing asked: none", want: none},
		{name: "RuntimeDefault", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}, want: runtimeDefault},
		{name: "Unconfined", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Unconfined}, want: none},
		{name: "Localhost", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: profile}, want: localhost},
		{name: "Localhost with prefix", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: "localhost/" + profile}, want: localhost},
		{name: "Localhost missing file", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: missing},
			wantErr: `seccomp localhost profile "` + missing + `" does not exist on the node`},
		{name: "Localhost bad json", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: bad}, wantErr: "is not an OCI seccomp profile"},
		{name: "Localhost relative", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: "profile.json"}, wantErr: "must be an absolute path"},
		{name: "ref without Localhost", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault, LocalhostRef: profile}, wantErr: "only valid with profile type Localhost"},
		{name: "deprecated runtime/default", path: "runtime/default", want: runtimeDefault},
		{name: "deprecated docker/default", path: "docker/default", want: runtimeDefault},
		{name: "deprecated unconfined", path: "unconfined", want: none},
		{name: "deprecated localhost", path: "localhost/" + profile, want: localhost},
		{name: "deprecated nonsense", path: "default", wantErr: `seccomp_profile_path "default"`},
		{name: "field wins over deprecated path", profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Unconfined}, path: "runtime/default", want: none},
		{name: "privileged ignores RuntimeDefault", privileged: true, profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}, want: none, wantWarn: true},
		{name: "privileged unconfined, no warning", privileged: true, profile: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Unconfined}, want: none},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			//lint:ignore SA1019 the deprecated field is still honoured and tested.
			sc(in).Seccomp, sc(in).SeccompProfilePath = tc.profile, tc.path
			if tc.privileged {
				in.Pod.Linux.SecurityContext.Privileged = true
				sc(in).Privileged = true
			}
			if tc.wantErr != "" {
				_, err := Generate(in)
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			res := mustGenerate(t, in)
			s := res.Spec.Linux.Seccomp
			switch tc.want {
			case none:
				if s != nil {
					t.Errorf("seccomp %v: want none", s.DefaultAction)
				}
			case runtimeDefault:
				if s == nil || s.DefaultAction != specs.ActErrno || len(s.Syscalls) == 0 {
					t.Fatalf("seccomp %+v: want containerd's default profile", s)
				}
			case localhost:
				if s == nil || s.DefaultAction != specs.ActLog || len(s.Syscalls) != 1 || s.Syscalls[0].Names[0] != "mkdir" {
					t.Errorf("seccomp %+v: want the file's profile", s)
				}
			}
			if got := len(res.Warnings) > 0; got != tc.wantWarn {
				t.Errorf("warnings %q", res.Warnings)
			}
		})
	}
}

// TestSeccompDefaultFollowsCapabilities: containerd's default profile allows the
// syscalls a capability grants (mount with CAP_SYS_ADMIN), so it is computed from the
// final capability set.
func TestSeccompDefaultFollowsCapabilities(t *testing.T) {
	setHost(t, defaultHost())
	allowed := func(s *specs.LinuxSeccomp, name string) bool {
		for _, sc := range s.Syscalls {
			if sc.Action == specs.ActAllow && slices.Contains(sc.Names, name) && len(sc.Args) == 0 {
				return true
			}
		}
		return false
	}
	in := baseInput(t)
	sc(in).Seccomp = &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}
	if allowed(mustGenerate(t, in).Spec.Linux.Seccomp, "mount") {
		t.Error("mount allowed without CAP_SYS_ADMIN")
	}
	sc(in).Capabilities = &runtime.Capability{AddCapabilities: []string{"SYS_ADMIN"}}
	if !allowed(mustGenerate(t, in).Spec.Linux.Seccomp, "mount") {
		t.Error("mount not allowed with CAP_SYS_ADMIN")
	}
}

func TestMaskedAndReadonlyPaths(t *testing.T) {
	setHost(t, defaultHost())
	defMasked := append([]string{"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
		"/sys/devices/virtual/powercap", "/proc/scsi"}, "/sys/devices/system/cpu/cpu0/thermal_throttle")
	defReadonly := []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
	for _, tc := range []struct {
		name               string
		masked, readonly   []string
		privileged, userns bool
		wantMasked, wantRO []string
	}{
		{name: "unset: containerd's defaults", wantMasked: defMasked, wantRO: defReadonly},
		// Over gRPC kubelet's empty lists (procMount: Unmasked, allowed only with
		// hostUsers: false) arrive as nil.
		{name: "user namespace, unset: Unmasked, none", userns: true},
		{name: "user namespace, kubelet's Default lists used", userns: true, masked: []string{"/proc/kcore"}, readonly: []string{"/proc/sys"}, wantMasked: []string{"/proc/kcore"}, wantRO: []string{"/proc/sys"}},
		{name: "kubelet's lists are used exactly", masked: []string{"/proc/kcore"}, readonly: []string{"/proc/sys"}, wantMasked: []string{"/proc/kcore"}, wantRO: []string{"/proc/sys"}},
		{name: "empty lists (Unmasked) mean none", masked: []string{}, readonly: []string{}, wantMasked: []string{}, wantRO: []string{}},
		{name: "privileged: none", privileged: true, masked: []string{"/proc/kcore"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			sc(in).MaskedPaths, sc(in).ReadonlyPaths = tc.masked, tc.readonly
			if tc.userns {
				r := idmap(0, 100000, 65536)
				in.Pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{r}).UsernsOptions
			}
			if tc.privileged {
				in.Pod.Linux.SecurityContext.Privileged = true
				sc(in).Privileged = true
			}
			l := mustGenerate(t, in).Spec.Linux
			equal(t, "masked", l.MaskedPaths, tc.wantMasked)
			equal(t, "readonly", l.ReadonlyPaths, tc.wantRO)
		})
	}
}

func TestSysctls(t *testing.T) {
	setHost(t, defaultHost())
	for _, tc := range []struct {
		name             string
		sysctls          map[string]string
		hostNet, hostIPC bool
		wantErr          string
	}{
		{name: "namespaced", sysctls: map[string]string{"net.ipv4.ip_forward": "1", "kernel.shmmax": "1", "kernel.msgmax": "1", "kernel.sem": "1 2 3 4", "fs.mqueue.msg_max": "10"}},
		{name: "net on host network", sysctls: map[string]string{"net.core.somaxconn": "1024"}, hostNet: true, wantErr: "sysctl net.core.somaxconn cannot be set in a pod that uses the host network"},
		{name: "ipc on host ipc", sysctls: map[string]string{"kernel.shmmax": "1"}, hostIPC: true, wantErr: "host IPC namespace"},
		{name: "ipc sysctl fine on host network", sysctls: map[string]string{"kernel.shmmax": "1"}, hostNet: true},
		{name: "not namespaced", sysctls: map[string]string{"kernel.panic": "1"}, wantErr: "sysctl kernel.panic is not namespaced"},
		{name: "vm is not namespaced", sysctls: map[string]string{"vm.swappiness": "1"}, wantErr: "is not namespaced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			in.Pod.Linux.Sysctls = tc.sysctls
			ns := in.Pod.Linux.SecurityContext.NamespaceOptions
			if tc.hostNet {
				ns.Network, in.NetNSPath = runtime.NamespaceMode_NODE, ""
			}
			if tc.hostIPC {
				ns.Ipc = runtime.NamespaceMode_NODE
			}
			if tc.wantErr != "" {
				_, err := Generate(in)
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			// Pod sysctls are the pause's business: not repeated in the container.
			if s := mustGenerate(t, in).Spec.Linux.Sysctl; s != nil {
				t.Errorf("container spec sysctls %v", s)
			}
		})
	}
}

func TestAnnotations(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	in.Config.Annotations = map[string]string{"a": "b", criann.SandboxID: "forged"}
	equal(t, "annotations", mustGenerate(t, in).Spec.Annotations, map[string]string{
		"a":                     "b",
		criann.ContainerType:    "container",
		criann.SandboxID:        "p1",
		criann.SandboxName:      "pod",
		criann.SandboxNamespace: "default",
		criann.SandboxUID:       "uid-1",
		criann.ContainerName:    "app",
		criann.ImageName:        "busybox",
	})
	in.ImageName = "docker.io/library/busybox:latest"
	equal(t, "image name", mustGenerate(t, in).Spec.Annotations[criann.ImageName], in.ImageName)
	in.SandboxID = ""
	if v, ok := mustGenerate(t, in).Spec.Annotations[criann.SandboxID]; ok {
		t.Errorf("sandbox-id annotation %q without a sandbox id", v)
	}
}

func TestBadInput(t *testing.T) {
	setHost(t, defaultHost())
	for _, tc := range []struct {
		name   string
		modify func(*Input)
		want   string
	}{
		{"no config", func(in *Input) { in.Config = nil }, "container config is required"},
		{"no pod", func(in *Input) { in.Pod = nil }, "pod sandbox config is required"},
		{"bad id", func(in *Input) { in.ContainerID = "../x" }, `container id "../x"`},
		{"no name", func(in *Input) { in.Config.Metadata = nil }, "no metadata name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			tc.modify(&in)
			_, err := Generate(in)
			wantErr(t, err, isInvalid, tc.want)
		})
	}
}

// TestGenerateOnThisHost runs Generate with the real host probes (cgroup version,
// mountinfo, capabilities, /dev), privileged and not, to catch a probe that fails
// outside the stubs.
func TestGenerateOnThisHost(t *testing.T) {
	in := baseInput(t)
	in.Config.Devices = []*runtime.Device{{ContainerPath: "/dev/x", HostPath: "/dev/null", Permissions: "rwm"}}
	sc(in).Seccomp = &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}
	in.Config.Linux.Resources = &runtime.LinuxContainerResources{MemoryLimitInBytes: 64 << 20}
	res := mustGenerate(t, in)
	if len(res.Spec.Process.Capabilities.Bounding) != len(defaultCapabilities) || res.Spec.Linux.Seccomp == nil {
		t.Errorf("caps %v seccomp %v", res.Spec.Process.Capabilities.Bounding, res.Spec.Linux.Seccomp != nil)
	}
	if got := findNamespace(res.Spec, specs.CgroupNamespace); got != cgroup2() {
		t.Errorf("cgroup namespace %v on a host with cgroup v2 %v", got, cgroup2())
	}

	in.Pod.Linux.SecurityContext.Privileged = true
	sc(in).Privileged = true
	res = mustGenerate(t, in)
	all, err := allCapabilities()
	if err != nil || len(all) == 0 {
		t.Fatalf("all capabilities %v: %v", all, err)
	}
	equal(t, "privileged caps", res.Spec.Process.Capabilities.Bounding, all)
	if len(res.Spec.Linux.Devices) < 2 {
		t.Errorf("privileged devices %d: want the host's", len(res.Spec.Linux.Devices))
	}
}

func findNamespace(s *specs.Spec, typ specs.LinuxNamespaceType) bool {
	return slices.ContainsFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == typ })
}
