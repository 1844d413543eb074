package cri

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/config"
)

func goodPod() *runtime.PodSandboxConfig {
	return &runtime.PodSandboxConfig{
		Metadata: &runtime.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "u1"},
		Hostname: "web",
		Linux:    &runtime.LinuxPodSandboxConfig{CgroupParent: "/kubepods/pod1"},
	}
}

// usernsPod gives c the namespace options ns with a user namespace of the given mode
// (kubelet's range for hostUsers: false: 0 -> 100000, 65536 ids).
func usernsPod(c *runtime.PodSandboxConfig, mode runtime.NamespaceMode, ns *runtime.NamespaceOption) *runtime.PodSandboxConfig {
	m := []*runtime.IDMapping{{ContainerId: 0, HostId: 100000, Length: 65536}}
	ns.UsernsOptions = &runtime.UserNamespace{Mode: mode, Uids: m, Gids: m}
	c.Linux.SecurityContext = &runtime.LinuxSandboxSecurityContext{NamespaceOptions: ns}
	return c
}

func TestValidatePodConfig(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig
		driver  string
		wantErr string
	}{
		{name: "good", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig { return c }},
		{name: "nil", mutate: func(*runtime.PodSandboxConfig) *runtime.PodSandboxConfig { return nil }, wantErr: "config is required"},
		{name: "no metadata", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig { c.Metadata = nil; return c }, wantErr: "no metadata"},
		{name: "no uid", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig { c.Metadata.Uid = ""; return c }, wantErr: "metadata.uid is empty"},
		{name: "slash in name", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig { c.Metadata.Name = "a/b"; return c }, wantErr: "metadata.name"},
		{name: "long hostname", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Hostname = strings.Repeat("h", 65)
			return c
		}, wantErr: "hostname"},
		{name: "bad dns server", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.DnsConfig = &runtime.DNSConfig{Servers: []string{"dns.example"}}
			return c
		}, wantErr: "not an IP address"},
		// A hostname goes into /etc/hosts next to the pod's IP (podfiles.Write): a line
		// break or a tab there adds an entry or an alias of the caller's choosing.
		{name: "hostname with a line break", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Hostname = "web\n203.0.113.9\tevil"
			return c
		}, wantErr: "hostname"},
		{name: "hostname with a tab", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Hostname = "web\tevil"
			return c
		}, wantErr: "hostname"},
		{name: "pod name with a line break as the hostname", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Hostname, c.Metadata.Name = "", "web\n203.0.113.9\tevil"
			return c
		}, wantErr: "hostname"},
		{name: "pod name on the host network is not the hostname", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Hostname, c.Metadata.Name = "", "web_0 "
			c.Linux.SecurityContext = &runtime.LinuxSandboxSecurityContext{NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE}}
			return c
		}},
		{name: "dns option with a line break", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.DnsConfig = &runtime.DNSConfig{Servers: []string{"10.0.0.10"}, Options: []string{"ndots:5\nnameserver 203.0.113.9"}}
			return c
		}, wantErr: "dns_config.options[0]"},
		{name: "dns search with a carriage return", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.DnsConfig = &runtime.DNSConfig{Searches: []string{"svc.local\rnameserver"}}
			return c
		}, wantErr: "dns_config.searches[0]"},
		{name: "four dns servers", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.DnsConfig = &runtime.DNSConfig{Servers: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}}
			return c
		}, wantErr: "4 servers, at most 3"},
		{name: "kubelet's dns config", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.DnsConfig = &runtime.DNSConfig{Servers: []string{"10.96.0.10", "fd00::10", "10.0.0.2"},
				Searches: []string{"default.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Options: []string{"ndots:5", "edns0"}}
			return c
		}},
		{name: "bad port", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.PortMappings = []*runtime.PortMapping{{ContainerPort: 70000}}
			return c
		}, wantErr: "container_port"},
		{name: "target netns", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.SecurityContext = &runtime.LinuxSandboxSecurityContext{NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_TARGET}}
			return c
		}, wantErr: "namespace_options.network"},
		{name: "run_as_group without run_as_user", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.SecurityContext = &runtime.LinuxSandboxSecurityContext{RunAsGroup: &runtime.Int64Value{Value: 3000}}
			return c
		}, wantErr: "run_as_group 3000 is set without run_as_user"},
		{name: "run_as_group with run_as_user", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.SecurityContext = &runtime.LinuxSandboxSecurityContext{RunAsUser: &runtime.Int64Value{Value: 0}, RunAsGroup: &runtime.Int64Value{Value: 3000}}
			return c
		}},
		{name: "node sysctl", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.Sysctls = map[string]string{"vm.overcommit_memory": "1"}
			return c
		}, wantErr: "not namespaced"},
		{name: "escaping sysctl", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.Sysctls = map[string]string{"net/../../kernel/panic": "1"}
			return c
		}, wantErr: "not a valid sysctl"},
		{name: "net sysctl on host network", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.SecurityContext = &runtime.LinuxSandboxSecurityContext{NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE}}
			c.Linux.Sysctls = map[string]string{"net.ipv4.ip_forward": "1"}
			return c
		}, wantErr: "host network"},
		{name: "userns on host network", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			return usernsPod(c, runtime.NamespaceMode_POD, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE})
		}},
		{name: "userns on host network with an ipc sysctl", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c = usernsPod(c, runtime.NamespaceMode_POD, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE})
			c.Linux.Sysctls = map[string]string{"kernel.shm_rmid_forced": "1"}
			return c
		}},
		{name: "userns on host network with a net sysctl", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c = usernsPod(c, runtime.NamespaceMode_POD, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE})
			c.Linux.Sysctls = map[string]string{"net.ipv4.ip_unprivileged_port_start": "80"}
			return c
		}, wantErr: "cannot be set in a pod that uses the host network"},
		{name: "userns mode CONTAINER on host network", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			return usernsPod(c, runtime.NamespaceMode_CONTAINER, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE})
		}, wantErr: "mode CONTAINER is not supported"},
		{name: "userns mode TARGET on host network", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			return usernsPod(c, runtime.NamespaceMode_TARGET, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE})
		}, wantErr: "mode TARGET is not supported"},
		{name: "userns on host network and ipc", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			return usernsPod(c, runtime.NamespaceMode_POD, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Ipc: runtime.NamespaceMode_NODE})
		}, wantErr: "host ipc namespace"},
		{name: "userns on host network and pid", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			return usernsPod(c, runtime.NamespaceMode_POD, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_NODE})
		}, wantErr: "host pid namespace"},
		{name: "privileged userns on host network", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c = usernsPod(c, runtime.NamespaceMode_POD, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE})
			c.Linux.SecurityContext.Privileged = true
			return c
		}, wantErr: "cannot be privileged"},
		{name: "userns with two ranges on host network", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c = usernsPod(c, runtime.NamespaceMode_POD, &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE})
			u := c.Linux.SecurityContext.NamespaceOptions.UsernsOptions
			u.Uids = append(u.Uids, &runtime.IDMapping{ContainerId: 65536, HostId: 300000, Length: 10})
			return c
		}, wantErr: "exactly one uid mapping"},
		{name: "slash sysctl ok", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.Sysctls = map[string]string{"net/ipv4/ping_group_range": "0 1"}
			return c
		}},
		{name: "relative cgroup", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.CgroupParent = "kubepods"
			return c
		}, wantErr: "absolute"},
		{name: "dotdot cgroup", mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.CgroupParent = "/a/../b"
			return c
		}, wantErr: "cgroup_parent"},
		{name: "systemd slice", driver: config.CgroupDriverSystemd, mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig {
			c.Linux.CgroupParent = "kubepods-pod1.slice"
			return c
		}},
		{name: "systemd path", driver: config.CgroupDriverSystemd, mutate: func(c *runtime.PodSandboxConfig) *runtime.PodSandboxConfig { return c }, wantErr: "slice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			driver := tc.driver
			if driver == "" {
				driver = config.CgroupDriverCgroupfs
			}
			err := validatePodConfig(tc.mutate(goodPod()), driver)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("err = %v, want InvalidArgument containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestCRITimeout(t *testing.T) {
	for _, tc := range []struct {
		seconds int64
		want    time.Duration
	}{
		{0, 0},
		{-1, 0},
		{math.MinInt64, 0},
		{1, time.Second},
		{3600, time.Hour},
		{maxTimeoutSeconds, time.Duration(maxTimeoutSeconds) * time.Second},
		// Past here time.Duration(s)*time.Second wraps around (MaxInt64 to -1s).
		{maxTimeoutSeconds + 1, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
	} {
		if got := criTimeout(tc.seconds); got != tc.want {
			t.Errorf("criTimeout(%d) = %v, want %v", tc.seconds, got, tc.want)
		}
	}
}

// TestStopContainerUnknownID: stopping a container crisp does not know succeeds (kubelet
// retries stops), an id that names none or several containers does not.
func TestStopContainerUnknownID(t *testing.T) {
	s := &Service{containers: map[string]*container{"abc1": {}, "abc2": {}}}
	for _, tc := range []struct {
		name, id string
		want     codes.Code
		wantMsg  string
	}{
		{name: "unknown id", id: "ffff", want: codes.OK},
		{name: "empty id", id: "", want: codes.InvalidArgument, wantMsg: "container id is required"},
		{name: "ambiguous prefix", id: "abc", want: codes.InvalidArgument, wantMsg: "ambiguous"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.StopContainer(context.Background(), &runtime.StopContainerRequest{ContainerId: tc.id, Timeout: 10})
			if got := status.Code(err); got != tc.want || !strings.Contains(status.Convert(err).Message(), tc.wantMsg) {
				t.Fatalf("StopContainer(%q) = %v (%v), want %v containing %q", tc.id, got, err, tc.want, tc.wantMsg)
			}
		})
	}
}

// TestSystemdCgroupParent: with the systemd driver a cgroup_parent that is a slice, or
// a path ending in one (critest's "/test.slice"), is taken as that slice, as containerd
// and CRI-O take it; anything else is refused.
func TestSystemdCgroupParent(t *testing.T) {
	for _, tc := range []struct {
		parent, want string // want "" means refused
	}{
		{"kubepods-pod1.slice", "kubepods-pod1.slice"},
		{"/test.slice", "test.slice"},
		{"a.slice/b.slice", "b.slice"},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice", "kubepods-besteffort-pod1.slice"},
		{"/test.slice/", "test.slice"},
		{"/kubepods/pod1", ""},
		{"/a/../b.slice", ""},
		{"/a//b.slice", ""},
		{"/.slice", ""},
		{".slice", ""},
		{"kubepods", ""},
	} {
		t.Run(tc.parent, func(t *testing.T) {
			err := validateCgroupParent(tc.parent, config.CgroupDriverSystemd)
			if tc.want == "" {
				if err == nil || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("validateCgroupParent = %v, want InvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("validateCgroupParent: %v", err)
			}
			if got := cgroupParent(tc.parent, config.CgroupDriverSystemd); got != tc.want {
				t.Errorf("cgroupParent = %q, want %q", got, tc.want)
			}
		})
	}
	if got := cgroupParent("/kubepods/pod1", config.CgroupDriverCgroupfs); got != "/kubepods/pod1" {
		t.Errorf("cgroupfs parent = %q, want it as given", got)
	}
}
