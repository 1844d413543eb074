package pod

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/testutil"
	"github.com/crisp-runtime/crisp/pkg/shimkit/pause"
)

func userns(ctr, host, size uint32) *optionsv1.UserNamespace {
	m := []*optionsv1.IDMapping{{ContainerId: ctr, HostId: host, Size: size}}
	return &optionsv1.UserNamespace{Uids: m, Gids: m}
}

func TestBuildSpec(t *testing.T) {
	tests := []struct {
		name      string
		id        string
		netns     string
		opts      *optionsv1.SandboxOptions
		wantErr   bool
		wantCg    string
		wantFlags [3]bool // newIPC, newUTS, newPID
	}{
		{name: "defaults", id: "p1", opts: &optionsv1.SandboxOptions{}, wantCg: "/crisp/crisp-p1", wantFlags: [3]bool{true, true, true}},
		{name: "host everything", id: "p1", opts: &optionsv1.SandboxOptions{
			Network: optionsv1.NamespaceMode_NODE, Pid: optionsv1.NamespaceMode_NODE, Ipc: optionsv1.NamespaceMode_NODE, Uts: optionsv1.NamespaceMode_NODE,
		}, wantCg: "/crisp/crisp-p1"},
		{name: "pid per container keeps a pod pid ns for the pause", id: "p1", opts: &optionsv1.SandboxOptions{Pid: optionsv1.NamespaceMode_CONTAINER}, wantCg: "/crisp/crisp-p1", wantFlags: [3]bool{true, true, true}},
		{name: "cgroup parent", id: "p1", opts: &optionsv1.SandboxOptions{CgroupParent: "/kubepods/besteffort/podx"}, wantCg: "/kubepods/besteffort/podx/crisp-p1", wantFlags: [3]bool{true, true, true}},
		{name: "systemd default slice", id: "p1", opts: &optionsv1.SandboxOptions{SystemdCgroup: true}, wantCg: "system.slice:crisp:p1", wantFlags: [3]bool{true, true, true}},
		{name: "ipc sysctl", id: "p1", opts: &optionsv1.SandboxOptions{Sysctls: map[string]string{"kernel.shm_rmid_forced": "1", "fs.mqueue.msg_max": "20"}}, wantCg: "/crisp/crisp-p1", wantFlags: [3]bool{true, true, true}},
		{name: "bad id", id: "a/b", opts: &optionsv1.SandboxOptions{}, wantErr: true},
		{name: "network CONTAINER", id: "p1", opts: &optionsv1.SandboxOptions{Network: optionsv1.NamespaceMode_CONTAINER}, wantErr: true},
		{name: "uts sysctl with host uts", id: "p1", opts: &optionsv1.SandboxOptions{Uts: optionsv1.NamespaceMode_NODE, Sysctls: map[string]string{"kernel.domainname": "x"}}, wantErr: true},
		{name: "empty sysctl value", id: "p1", opts: &optionsv1.SandboxOptions{Sysctls: map[string]string{"kernel.shmmax": ""}}, wantErr: true},
		{name: "newline in sysctl value", id: "p1", opts: &optionsv1.SandboxOptions{Sysctls: map[string]string{"kernel.shmmax": "1\nkernel.shmall=2"}}, wantErr: true},
		{name: "hostname too long", id: "p1", opts: &optionsv1.SandboxOptions{Hostname: string(make([]byte, 65))}, wantErr: true},
		{name: "relative netns", id: "p1", netns: "run/netns/x", opts: &optionsv1.SandboxOptions{}, wantErr: true},
		{name: "negative oom below range", id: "p1", opts: &optionsv1.SandboxOptions{OomScoreAdj: -1001}, wantErr: true},
		{name: "userns", id: "p1", opts: &optionsv1.SandboxOptions{Userns: userns(0, 100000, 65536), Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}}, wantCg: "/crisp/crisp-p1", wantFlags: [3]bool{true, true, true}},
		{name: "userns with a netns path", id: "p1", netns: "/run/netns/x", opts: &optionsv1.SandboxOptions{Userns: userns(0, 100000, 65536)}, wantErr: true},
		{name: "userns with host pid", id: "p1", opts: &optionsv1.SandboxOptions{Userns: userns(0, 100000, 65536), Pid: optionsv1.NamespaceMode_NODE}, wantErr: true},
		{name: "userns with host uts", id: "p1", opts: &optionsv1.SandboxOptions{Userns: userns(0, 100000, 65536), Uts: optionsv1.NamespaceMode_NODE}, wantErr: true},
		{name: "userns with host network and uts", id: "p1", opts: &optionsv1.SandboxOptions{Userns: userns(0, 100000, 65536),
			Network: optionsv1.NamespaceMode_NODE, Uts: optionsv1.NamespaceMode_NODE}, wantCg: "/crisp/crisp-p1", wantFlags: [3]bool{true, false, true}},
		{name: "userns with host network and a net sysctl", id: "p1", opts: &optionsv1.SandboxOptions{Userns: userns(0, 100000, 65536),
			Network: optionsv1.NamespaceMode_NODE, Uts: optionsv1.NamespaceMode_NODE, Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}}, wantErr: true},
		{name: "userns not mapping 0", id: "p1", opts: &optionsv1.SandboxOptions{Userns: userns(1, 100000, 65536)}, wantErr: true},
		{name: "userns length 0", id: "p1", opts: &optionsv1.SandboxOptions{Userns: userns(0, 100000, 0)}, wantErr: true},
		{name: "userns overflow", id: "p1", opts: &optionsv1.SandboxOptions{Userns: userns(0, 1<<32-100, 65536)}, wantErr: true},
		{name: "userns two ranges", id: "p1", opts: &optionsv1.SandboxOptions{Userns: &optionsv1.UserNamespace{
			Uids: []*optionsv1.IDMapping{{HostId: 1, Size: 1}, {ContainerId: 1, HostId: 5, Size: 1}}, Gids: []*optionsv1.IDMapping{{HostId: 1, Size: 1}}}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := buildSpec(tt.id, tt.netns, tt.opts)
			if tt.wantErr {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("err = %v, want InvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := spec.cgroup.String(); got != tt.wantCg {
				t.Errorf("cgroup = %q, want %q", got, tt.wantCg)
			}
			if got := [3]bool{spec.newIPC, spec.newUTS, spec.newPID}; got != tt.wantFlags {
				t.Errorf("new ipc/uts/pid = %v, want %v", got, tt.wantFlags)
			}
			wantUserns := tt.opts.GetUserns() != nil
			if wantNet := wantUserns && tt.opts.GetNetwork() != optionsv1.NamespaceMode_NODE; (spec.userns != nil) != wantUserns || spec.newNet != wantNet {
				t.Errorf("userns = %v, newNet = %v; want userns %v, newNet %v", spec.userns, spec.newNet, wantUserns, wantNet)
			}
		})
	}
}

func TestSysctlNamespace(t *testing.T) {
	for key, want := range map[string]string{
		"net.ipv4.ip_forward":    "network",
		"kernel.shm_rmid_forced": "ipc",
		"kernel.sem":             "ipc",
		"kernel.msgmax":          "ipc",
		"fs.mqueue.queues_max":   "ipc",
		"kernel.hostname":        "uts",
		"kernel.pid_max":         "",
		"vm.overcommit_memory":   "",
		"netx.foo":               "",
	} {
		if got := sysctlNamespace(key); got != want {
			t.Errorf("sysctlNamespace(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestBuildSpecUserNSNetNS: a user-namespaced pod given a netns path (containerd's
// shim sandboxer) joins the user namespace owning it; a netns of the host's user
// namespace is refused, since the pod's root would not own its network.
func TestBuildSpecUserNSNetNS(t *testing.T) {
	testutil.RequiresRoot(t, "creates a user namespace")
	holder := exec.Command("sleep", "60")
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	opts := &optionsv1.SandboxOptions{Userns: userns(0, 100000, 65536)}
	spec, err := buildSpec("p1", fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid), opts)
	if err != nil {
		t.Fatal(err)
	}
	if !spec.joinUserNS || spec.newNet || spec.userns == nil || !spec.newPID {
		t.Errorf("spec joinUserNS %v newNet %v userns %v newPID %v; want a joined user namespace and new PID namespace", spec.joinUserNS, spec.newNet, spec.userns, spec.newPID)
	}
	if err := checkIDMaps(holder.Process.Pid, *spec.userns); err != nil {
		t.Errorf("checkIDMaps of the same mapping: %v", err)
	}
	other := pause.IDMap{UID: pause.Range{HostID: 200000, Size: 65536}, GID: pause.Range{HostID: 100000, Size: 65536}}
	if err := checkIDMaps(holder.Process.Pid, other); err == nil || !strings.Contains(err.Error(), "uid_map") {
		t.Errorf("checkIDMaps of another uid range: %v, want an error naming uid_map", err)
	}
	_, err = buildSpec("p1", "/proc/self/ns/net", opts)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "host's user namespace") {
		t.Errorf("buildSpec with a host-owned netns: %v, want InvalidArgument naming the host's user namespace", err)
	}
}
