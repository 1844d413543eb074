package spec

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

func idmap(ctr, host, length uint32) *runtime.IDMapping {
	return &runtime.IDMapping{ContainerId: ctr, HostId: host, Length: length}
}

func podUserns(uids, gids []*runtime.IDMapping) *runtime.NamespaceOption {
	return &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: uids, Gids: gids}}
}

func TestPodUserNS(t *testing.T) {
	r := idmap(0, 100000, 65536)
	for _, tc := range []struct {
		name    string
		ns      *runtime.NamespaceOption
		want    *UserNS
		wantErr string
	}{
		{name: "no options", ns: &runtime.NamespaceOption{}},
		{name: "nil", ns: nil},
		{name: "node", ns: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE}}},
		{name: "pod", ns: podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{r}),
			want: &UserNS{UID: specs.LinuxIDMapping{HostID: 100000, Size: 65536}, GID: specs.LinuxIDMapping{HostID: 100000, Size: 65536}}},
		{name: "largest range", ns: podUserns([]*runtime.IDMapping{idmap(0, 1, math.MaxUint32-1)}, []*runtime.IDMapping{idmap(0, 1, math.MaxUint32-1)}),
			want: &UserNS{UID: specs.LinuxIDMapping{HostID: 1, Size: math.MaxUint32 - 1}, GID: specs.LinuxIDMapping{HostID: 1, Size: math.MaxUint32 - 1}}},
		{name: "node with mappings", ns: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE, Uids: []*runtime.IDMapping{r}}},
			wantErr: "mode NODE takes no uid or gid mappings"},
		{name: "container mode", ns: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_CONTAINER}},
			wantErr: "mode CONTAINER is not supported"},
		{name: "target mode", ns: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_TARGET, Uids: []*runtime.IDMapping{r}, Gids: []*runtime.IDMapping{r}}},
			wantErr: "mode TARGET is not supported"},
		{name: "no uids", ns: podUserns(nil, []*runtime.IDMapping{r}), wantErr: "exactly one uid mapping, got 0"},
		{name: "no gids", ns: podUserns([]*runtime.IDMapping{r}, nil), wantErr: "exactly one gid mapping, got 0"},
		{name: "two uid ranges", ns: podUserns([]*runtime.IDMapping{r, idmap(65536, 200000, 10)}, []*runtime.IDMapping{r}),
			wantErr: "exactly one uid mapping, got 2"},
		{name: "two gid ranges", ns: podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{r, idmap(65536, 200000, 10)}),
			wantErr: "exactly one gid mapping, got 2"},
		{name: "length 0", ns: podUserns([]*runtime.IDMapping{idmap(0, 100000, 0)}, []*runtime.IDMapping{r}),
			wantErr: "uid mapping container 0 -> host 100000 (length 0) has length 0"},
		{name: "container 0 not mapped", ns: podUserns([]*runtime.IDMapping{idmap(1, 100000, 65536)}, []*runtime.IDMapping{r}),
			wantErr: "does not map container id 0"},
		{name: "gid container 0 not mapped", ns: podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{idmap(1000, 100000, 65536)}),
			wantErr: "gid mapping container 1000 -> host 100000 (length 65536) does not map container id 0"},
		{name: "host overflow", ns: podUserns([]*runtime.IDMapping{idmap(0, math.MaxUint32-10, 65536)}, []*runtime.IDMapping{r}),
			wantErr: "overflows the host id space"},
		{name: "host reaches invalid id", ns: podUserns([]*runtime.IDMapping{idmap(0, 1, math.MaxUint32)}, []*runtime.IDMapping{r}),
			wantErr: "overflows the host id space"},
		{name: "uids and gids differ", ns: podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{idmap(0, 200000, 65536)}),
			wantErr: "uid mapping container 0 -> host 100000 (length 65536) and gid mapping container 0 -> host 200000 (length 65536) differ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PodUserNS(tc.ns)
			if tc.wantErr != "" {
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatalf("PodUserNS: %v", err)
			}
			equal(t, "user namespace", got, tc.want)
		})
	}
}

func TestContainerUserNS(t *testing.T) {
	r := idmap(0, 100000, 65536)
	pod := podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{r})
	other := podUserns([]*runtime.IDMapping{idmap(0, 200000, 65536)}, []*runtime.IDMapping{idmap(0, 200000, 65536)})
	node := &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE}}
	want := &UserNS{UID: specs.LinuxIDMapping{HostID: 100000, Size: 65536}, GID: specs.LinuxIDMapping{HostID: 100000, Size: 65536}}
	for _, tc := range []struct {
		name     string
		ctr, pod *runtime.NamespaceOption
		want     *UserNS
		wantErr  string
	}{
		{name: "both host", ctr: &runtime.NamespaceOption{}, pod: &runtime.NamespaceOption{}},
		{name: "container inherits pod", ctr: &runtime.NamespaceOption{}, pod: pod, want: want},
		{name: "same", ctr: pod, pod: pod, want: want},
		{name: "different mapping", ctr: other, pod: pod, wantErr: "differ from the pod's"},
		{name: "container node in userns pod", ctr: node, pod: pod, wantErr: "asks for the host user namespace"},
		{name: "container pod in host pod", ctr: pod, pod: node, wantErr: "its pod runs in the host's"},
		{name: "invalid pod", ctr: &runtime.NamespaceOption{}, pod: podUserns(nil, nil), wantErr: "pod: user namespace mode POD needs exactly one uid mapping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ContainerUserNS(tc.ctr, tc.pod)
			if tc.wantErr != "" {
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatalf("ContainerUserNS: %v", err)
			}
			equal(t, "user namespace", got, tc.want)
		})
	}
}

func TestCheckPodUserNS(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ns      *runtime.NamespaceOption
		priv    bool
		wantErr string
	}{
		{name: "own namespaces", ns: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_CONTAINER}},
		// containerd's user_namespaces_host_network: allowed.
		{name: "host network", ns: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE}},
		{name: "host ipc", ns: &runtime.NamespaceOption{Ipc: runtime.NamespaceMode_NODE}, wantErr: "host ipc namespace"},
		{name: "host pid", ns: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_NODE}, wantErr: "host pid namespace"},
		{name: "host network and ipc", ns: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Ipc: runtime.NamespaceMode_NODE}, wantErr: "host ipc namespace"},
		{name: "host network and pid", ns: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_NODE}, wantErr: "host pid namespace"},
		{name: "privileged", ns: &runtime.NamespaceOption{}, priv: true, wantErr: "cannot be privileged"},
		{name: "privileged on host network", ns: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE}, priv: true, wantErr: "cannot be privileged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckPodUserNS(&runtime.PodSandboxConfig{Linux: &runtime.LinuxPodSandboxConfig{
				SecurityContext: &runtime.LinuxSandboxSecurityContext{NamespaceOptions: tc.ns, Privileged: tc.priv}}})
			if tc.wantErr != "" {
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatalf("CheckPodUserNS: %v", err)
			}
		})
	}
}

// TestGenerateUserNS: a container of a user-namespaced pod joins the pause process's
// user namespace by path, and its volumes become idmapped binds with the pod's range.
func TestGenerateUserNS(t *testing.T) {
	setHost(t, defaultHost())
	r := idmap(0, 100000, 65536)
	vol := t.TempDir()
	in := baseInput(t)
	in.Pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{r}).UsernsOptions
	in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/data", HostPath: vol}}
	s := mustGenerate(t, in).Spec
	want := specs.LinuxNamespace{Type: specs.UserNamespace, Path: fmt.Sprintf("/proc/%d/ns/user", in.PausePid)}
	if !slices.Contains(s.Linux.Namespaces, want) {
		t.Fatalf("namespaces %+v lack %+v", s.Linux.Namespaces, want)
	}
	if s.Linux.UIDMappings != nil || s.Linux.GIDMappings != nil {
		t.Errorf("linux.uidMappings/gidMappings set next to a userns path: %v %v", s.Linux.UIDMappings, s.Linux.GIDMappings)
	}
	var data *specs.Mount
	for i := range s.Mounts {
		if s.Mounts[i].Destination == "/data" {
			data = &s.Mounts[i]
		}
	}
	if data == nil {
		t.Fatal("no /data mount")
	}
	m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
	equal(t, "uid mappings", data.UIDMappings, m)
	equal(t, "gid mappings", data.GIDMappings, m)
	if !slices.Contains(data.Options, "idmap") {
		t.Errorf("volume options %v lack idmap", data.Options)
	}
	for _, mnt := range s.Mounts {
		if mnt.Destination != "/data" && mnt.UIDMappings != nil {
			t.Errorf("mount %s is idmapped; only volumes should be", mnt.Destination)
		}
	}

	// A volume's own mappings win; mappings on a volume of a pod without a user
	// namespace are refused.
	in.Config.Mounts[0].UidMappings = []*runtime.IDMapping{idmap(0, 300000, 1000)}
	in.Config.Mounts[0].GidMappings = []*runtime.IDMapping{idmap(0, 300000, 1000)}
	s = mustGenerate(t, in).Spec
	for _, mnt := range s.Mounts {
		if mnt.Destination == "/data" {
			equal(t, "volume's own uid mappings", mnt.UIDMappings, []specs.LinuxIDMapping{{HostID: 300000, Size: 1000}})
		}
	}
	in.Config.Mounts[0].GidMappings = nil
	_, err := Generate(in)
	wantErr(t, err, isInvalid, "exactly one gid mapping")

	in = baseInput(t)
	in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/data", HostPath: vol, UidMappings: []*runtime.IDMapping{r}, GidMappings: []*runtime.IDMapping{r}}}
	_, err = Generate(in)
	wantErr(t, err, isInvalid, "the pod has no user namespace")

	// Containers must agree with their pod.
	in = baseInput(t)
	in.Pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{r}).UsernsOptions
	sc(in).NamespaceOptions.UsernsOptions = &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD,
		Uids: []*runtime.IDMapping{idmap(0, 200000, 65536)}, Gids: []*runtime.IDMapping{idmap(0, 200000, 65536)}}
	_, err = Generate(in)
	wantErr(t, err, isInvalid, "differ from the pod's")
}

// TestGenerateUserNSHostNetwork: a container of a user-namespaced pod on the host
// network (containerd's user_namespaces_host_network) joins the pod's user, IPC and PID
// namespaces, stays in the host's network and UTS namespaces, keeps its idmapped
// volumes and the pod's hosts and resolv.conf, and gets the host's /sys bound
// read-only (sysfs cannot be mounted from a user namespace that does not own the
// network namespace).
func TestGenerateUserNSHostNetwork(t *testing.T) {
	setHost(t, defaultHost())
	r := idmap(0, 100000, 65536)
	vol := t.TempDir()
	podDir := t.TempDir()
	for _, f := range []string{"hosts", "resolv.conf", "hostname"} {
		if err := os.WriteFile(filepath.Join(podDir, f), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hostNetUserns := func() Input {
		in := baseInput(t)
		for _, ns := range []*runtime.NamespaceOption{in.Pod.Linux.SecurityContext.NamespaceOptions, sc(in).NamespaceOptions} {
			ns.Network, ns.Pid = runtime.NamespaceMode_NODE, runtime.NamespaceMode_POD
		}
		in.NetNSPath = ""
		in.PodFilesDir = podDir
		in.Pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{r}).UsernsOptions
		in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/data", HostPath: vol}}
		return in
	}
	in := hostNetUserns()
	s := mustGenerate(t, in).Spec
	equal(t, "namespaces", s.Linux.Namespaces, []specs.LinuxNamespace{
		{Type: specs.IPCNamespace, Path: "/proc/100/ns/ipc"},
		{Type: specs.PIDNamespace, Path: "/proc/100/ns/pid"},
		{Type: specs.MountNamespace},
		{Type: specs.CgroupNamespace},
		{Type: specs.UserNamespace, Path: "/proc/100/ns/user"},
	})
	equal(t, "/sys", findMount(s, "/sys"), &specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys",
		Options: []string{"rbind", "rro", "nosuid", "nodev", "noexec"}})
	if m := findMount(s, cgroupMountDst); m == nil || m.Type != "cgroup" {
		t.Errorf("cgroup mount %+v, want the container's own cgroup mount over the bound /sys", m)
	}
	data := findMount(s, "/data")
	if data == nil || !slices.Contains(data.Options, "idmap") || len(data.UIDMappings) != 1 || data.UIDMappings[0].HostID != 100000 {
		t.Errorf("volume %+v, want an idmapped bind with the pod's range", data)
	}
	for _, f := range []struct{ file, dst string }{{"hosts", etcHosts}, {"resolv.conf", etcResolvConf}, {"hostname", etcHostname}} {
		if m := findMount(s, f.dst); m == nil || m.Source != filepath.Join(podDir, f.file) || m.UIDMappings != nil {
			t.Errorf("%s mount %+v, want the pod's %s, not idmapped", f.dst, m, f.file)
		}
	}

	// Without a user namespace a host-network pod mounts sysfs as any other.
	in = hostNetUserns()
	in.Pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = nil
	in.Config.Mounts = nil
	if m := findMount(mustGenerate(t, in).Spec, "/sys"); m == nil || m.Type != "sysfs" {
		t.Errorf("/sys of a host-network pod without a user namespace = %+v, want sysfs", m)
	}
	// Nor does a user-namespaced pod with a network namespace of its own.
	in = baseInput(t)
	in.Pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = podUserns([]*runtime.IDMapping{r}, []*runtime.IDMapping{r}).UsernsOptions
	if m := findMount(mustGenerate(t, in).Spec, "/sys"); m == nil || m.Type != "sysfs" {
		t.Errorf("/sys of a user-namespaced pod with its own network = %+v, want sysfs", m)
	}

	// A kernel without mount_setattr could not make the bound /sys read-only below.
	in = hostNetUserns()
	in.RecursiveReadOnlyMounts = false
	_, err := Generate(in)
	wantErr(t, err, isFailedPrecondition, "mount_setattr")

	// A net sysctl cannot be set on the host network, user namespace or not.
	in = hostNetUserns()
	in.Pod.Linux.Sysctls = map[string]string{"net.ipv4.ip_unprivileged_port_start": "80"}
	_, err = Generate(in)
	wantErr(t, err, isInvalid, "host network")
}

func TestIDMappedMountsSupported(t *testing.T) {
	testutil.RequiresRoot(t, "idmapped mounts need CAP_SYS_ADMIN")
	// /proc cannot be idmapped: the probe must say so rather than claim support.
	if err := IDMappedMountsSupported("/proc"); err == nil {
		t.Error("IDMappedMountsSupported(/proc) = nil, want an error")
	}
	if err := IDMappedMountsSupported(t.TempDir()); err != nil {
		// tmpfs and ext4 both support idmapped mounts since Linux 6.3.
		t.Errorf("IDMappedMountsSupported(temp dir): %v", err)
	}
}
