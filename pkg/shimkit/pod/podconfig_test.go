package pod

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/podfiles"
	kitsandbox "github.com/crisp-runtime/crisp/pkg/shimkit/sandbox"
)

// fullPodConfig sets every PodSandboxConfig field the shim skips too, so that a wrong
// field number or wire type in the hand-written decoder shows up.
func fullPodConfig(ns *runtime.NamespaceOption) *runtime.PodSandboxConfig {
	return &runtime.PodSandboxConfig{
		Metadata:     &runtime.PodSandboxMetadata{Name: "web", Uid: "uid-1", Namespace: "default", Attempt: 3},
		Hostname:     "web-0",
		LogDirectory: "/var/log/pods/default_web_uid-1",
		DnsConfig:    &runtime.DNSConfig{Servers: []string{"10.0.0.10"}, Searches: []string{"svc.cluster.local"}, Options: []string{"ndots:5"}},
		PortMappings: []*runtime.PortMapping{{Protocol: runtime.Protocol_UDP, ContainerPort: 53, HostPort: 5353, HostIp: "127.0.0.1"}},
		Labels:       map[string]string{"app": "web"},
		Annotations:  map[string]string{"a": "b"},
		Linux: &runtime.LinuxPodSandboxConfig{
			CgroupParent: "/kubepods/besteffort/poduid-1",
			SecurityContext: &runtime.LinuxSandboxSecurityContext{
				NamespaceOptions:   ns,
				SelinuxOptions:     &runtime.SELinuxOption{User: "u", Role: "r", Type: "t", Level: "s0"},
				RunAsUser:          &runtime.Int64Value{Value: 1000},
				RunAsGroup:         &runtime.Int64Value{Value: 1000},
				ReadonlyRootfs:     true,
				SupplementalGroups: []int64{5, 6},
				Privileged:         true,
				Seccomp:            &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault},
			},
			Sysctls:   map[string]string{"net/ipv4/ip_unprivileged_port_start": "0", "kernel.shm_rmid_forced": "1"},
			Overhead:  &runtime.LinuxContainerResources{CpuShares: 2, MemoryLimitInBytes: 1 << 20},
			Resources: &runtime.LinuxContainerResources{CpuQuota: 50000, CpuPeriod: 100000},
		},
	}
}

func podConfigAny(t *testing.T, cfg *runtime.PodSandboxConfig, typeURL string) *anypb.Any {
	t.Helper()
	data, err := proto.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &anypb.Any{TypeUrl: typeURL, Value: data}
}

func TestUnpackPodSandboxConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  *runtime.PodSandboxConfig
		want *optionsv1.SandboxOptions
		// files are the pod's files the shim writes; DNS in fullPodConfig's.
		files podfiles.Pod
	}{{
		name: "pod namespaces",
		cfg:  fullPodConfig(&runtime.NamespaceOption{Pid: runtime.NamespaceMode_CONTAINER}),
		want: &optionsv1.SandboxOptions{
			Hostname: "web-0", Pid: optionsv1.NamespaceMode_CONTAINER,
			Sysctls:      map[string]string{"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shm_rmid_forced": "1"},
			CgroupParent: "/kubepods/besteffort/poduid-1", OomScoreAdj: -998,
		},
		files: podfiles.Pod{Hostname: "web-0", DNS: podfiles.DNS{Servers: []string{"10.0.0.10"}, Searches: []string{"svc.cluster.local"}, Options: []string{"ndots:5"}}},
	}, {
		name: "host network, pid and ipc",
		cfg: func() *runtime.PodSandboxConfig {
			c := fullPodConfig(&runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_NODE, Ipc: runtime.NamespaceMode_NODE})
			c.Linux.Sysctls = nil
			c.Linux.CgroupParent = "kubepods-besteffort-poduid_1.slice"
			return c
		}(),
		want: &optionsv1.SandboxOptions{
			Network: optionsv1.NamespaceMode_NODE, Pid: optionsv1.NamespaceMode_NODE, Ipc: optionsv1.NamespaceMode_NODE, Uts: optionsv1.NamespaceMode_NODE,
			Sysctls: map[string]string{}, CgroupParent: "kubepods-besteffort-poduid_1.slice", SystemdCgroup: true, OomScoreAdj: -998,
		},
		files: podfiles.Pod{HostNetwork: true, DNS: podfiles.DNS{Servers: []string{"10.0.0.10"}, Searches: []string{"svc.cluster.local"}, Options: []string{"ndots:5"}}},
	}, {
		name:  "hostname defaults to the pod name",
		cfg:   &runtime.PodSandboxConfig{Metadata: &runtime.PodSandboxMetadata{Name: strings.Repeat("n", 70)}},
		want:  &optionsv1.SandboxOptions{Hostname: strings.Repeat("n", 64), Sysctls: map[string]string{}, OomScoreAdj: -998},
		files: podfiles.Pod{Hostname: strings.Repeat("n", 64)},
	}, {
		name: "user namespace",
		cfg: &runtime.PodSandboxConfig{Hostname: "u", Linux: &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{
				Mode: runtime.NamespaceMode_POD,
				Uids: []*runtime.IDMapping{{HostId: 65536, ContainerId: 0, Length: 65536}},
				Gids: []*runtime.IDMapping{{HostId: 131072, ContainerId: 0, Length: 65536}},
			}}}}},
		want: &optionsv1.SandboxOptions{Hostname: "u", Sysctls: map[string]string{}, OomScoreAdj: -998, Userns: &optionsv1.UserNamespace{
			Uids: []*optionsv1.IDMapping{{HostId: 65536, Size: 65536}},
			Gids: []*optionsv1.IDMapping{{HostId: 131072, Size: 65536}},
		}},
		files: podfiles.Pod{Hostname: "u"},
	}, {
		name: "host user namespace",
		cfg: &runtime.PodSandboxConfig{Hostname: "u", Linux: &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE}}}}},
		want:  &optionsv1.SandboxOptions{Hostname: "u", Sysctls: map[string]string{}, OomScoreAdj: -998},
		files: podfiles.Pod{Hostname: "u"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// typeurl (containerd) writes the bare name; anypb.New the prefixed URL.
			for _, url := range []string{"runtime.v1.PodSandboxConfig", "type.googleapis.com/runtime.v1.PodSandboxConfig"} {
				got, files, err := unpackOptions(podConfigAny(t, tt.cfg, url))
				if err != nil {
					t.Fatalf("%s: %v", url, err)
				}
				if files == nil || !reflect.DeepEqual(*files, tt.files) {
					t.Errorf("%s: pod files %+v, want %+v", url, files, tt.files)
				}
				if !proto.Equal(got, tt.want) {
					t.Errorf("%s:\n got %v\nwant %v", url, got, tt.want)
				}
			}
		})
	}
}

// The two option forms give the pause process the same pod.
func TestPodSandboxConfigSpecMatchesSandboxOptions(t *testing.T) {
	cfg := fullPodConfig(&runtime.NamespaceOption{})
	fromCRI, _, err := unpackOptions(podConfigAny(t, cfg, "runtime.v1.PodSandboxConfig"))
	if err != nil {
		t.Fatal(err)
	}
	crisp, err := anypb.New(&optionsv1.SandboxOptions{
		Hostname: "web-0", Sysctls: map[string]string{"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shm_rmid_forced": "1"},
		CgroupParent: "/kubepods/besteffort/poduid-1", OomScoreAdj: -998,
	})
	if err != nil {
		t.Fatal(err)
	}
	fromCrisp, files, err := unpackOptions(crisp)
	if err != nil {
		t.Fatal(err)
	}
	if files != nil {
		// crisp's controller writes the pod's files itself.
		t.Errorf("SandboxOptions gave pod files %+v", files)
	}
	// No netns path: checkNetNS would need a real namespace file; the ipc sysctl
	// is still checked against the pod's namespaces.
	cfg.Linux.Sysctls = map[string]string{"kernel.shm_rmid_forced": "1"}
	fromCRI.Sysctls, fromCrisp.Sysctls = map[string]string{"kernel.shm_rmid_forced": "1"}, map[string]string{"kernel.shm_rmid_forced": "1"}
	a, errA := buildSpec("p1", "", fromCRI)
	b, errB := buildSpec("p1", "", fromCrisp)
	if errA != nil || errB != nil {
		t.Fatalf("buildSpec: %v / %v", errA, errB)
	}
	if a.hostname != b.hostname || a.modes != b.modes || a.oomScore != b.oomScore || a.cgroup != b.cgroup ||
		a.newIPC != b.newIPC || a.newPID != b.newPID || a.newUTS != b.newUTS || len(a.sysctls) != len(b.sysctls) {
		t.Errorf("specs differ:\n CRI   %+v\n crisp %+v", a, b)
	}
	if a.cgroup.Path != "/kubepods/besteffort/poduid-1/crisp-p1" || a.hostname != "web-0" {
		t.Errorf("spec from PodSandboxConfig: cgroup %q hostname %q", a.cgroup.Path, a.hostname)
	}
}

func TestUnpackPodSandboxConfigErrors(t *testing.T) {
	for name, a := range map[string]*anypb.Any{
		"truncated": {TypeUrl: "runtime.v1.PodSandboxConfig", Value: []byte{0x42, 0x10, 0x0a}},
		"pid TARGET": podConfigAny(t, &runtime.PodSandboxConfig{Linux: &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_TARGET}}}}, "runtime.v1.PodSandboxConfig"),
		"userns CONTAINER": podConfigAny(t, &runtime.PodSandboxConfig{Linux: &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_CONTAINER}}}}}, "runtime.v1.PodSandboxConfig"),
		"other message": {TypeUrl: "runtime.v1.ContainerConfig"},
	} {
		if _, _, err := unpackOptions(a); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
}

// TestUnpackPodSandboxConfigRefusesPodFiles: what containerd's shim sandboxer sends for
// the pod's files passes the checks crisp's CRI server makes (podfiles.Pod.Validate),
// so that a DNS option or a hostname cannot add a line of its own to the pod's
// resolv.conf or hosts, and the error names the field.
func TestUnpackPodSandboxConfigRefusesPodFiles(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  *runtime.PodSandboxConfig
		want string
	}{
		{"dns option with a line break", &runtime.PodSandboxConfig{Hostname: "web",
			DnsConfig: &runtime.DNSConfig{Servers: []string{"10.0.0.10"}, Options: []string{"ndots:5\nnameserver 203.0.113.9"}}},
			`dns_config.options[0] "ndots:5\nnameserver 203.0.113.9"`},
		{"dns search with a line break", &runtime.PodSandboxConfig{Hostname: "web",
			DnsConfig: &runtime.DNSConfig{Searches: []string{"svc.local\nnameserver 203.0.113.9"}}}, "dns_config.searches[0]"},
		{"dns server not an IP", &runtime.PodSandboxConfig{Hostname: "web",
			DnsConfig: &runtime.DNSConfig{Servers: []string{"10.0.0.10\nsearch evil"}}}, "dns_config.servers[0]"},
		{"four dns servers", &runtime.PodSandboxConfig{Hostname: "web",
			DnsConfig: &runtime.DNSConfig{Servers: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}}}, "4 servers, at most 3"},
		{"hostname with a line break", &runtime.PodSandboxConfig{Hostname: "web\n203.0.113.9\tevil"}, "hostname"},
		{"pod name with a line break as the hostname", &runtime.PodSandboxConfig{Metadata: &runtime.PodSandboxMetadata{Name: "web\n203.0.113.9\tevil"}}, "hostname"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := unpackOptions(podConfigAny(t, tt.cfg, "runtime.v1.PodSandboxConfig"))
			if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("unpackOptions = %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
}

// TestCreateSandboxRefusesDNSLeavesNothing: CreateSandbox refuses a bad DNS config as
// InvalidArgument before it writes anything into the bundle.
func TestCreateSandboxRefusesDNSLeavesNothing(t *testing.T) {
	bundle := t.TempDir()
	s := kitsandbox.New(kitsandbox.Config{ID: "p1", Pod: New(Config{ID: "p1", Bundle: bundle})})
	// Were the request taken, the pod's cgroup and /dev/shm would have to go again.
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	cfg := &runtime.PodSandboxConfig{Hostname: "web", DnsConfig: &runtime.DNSConfig{
		Servers: []string{"10.0.0.10"}, Options: []string{"ndots:5\nnameserver 203.0.113.9"}}}
	_, err := s.CreateSandbox(context.Background(), &sandboxapi.CreateSandboxRequest{
		SandboxID: "p1", BundlePath: bundle, Options: podConfigAny(t, cfg, "runtime.v1.PodSandboxConfig")})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "dns_config.options[0]") {
		t.Fatalf("CreateSandbox = %v, want InvalidArgument naming dns_config.options[0]", err)
	}
	if entries, _ := os.ReadDir(bundle); len(entries) > 0 {
		t.Errorf("CreateSandbox left %v in the bundle", entries)
	}
	if s.Created() {
		t.Error("the refused sandbox is recorded as created")
	}
}
