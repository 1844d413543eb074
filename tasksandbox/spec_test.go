package tasksandbox

import (
	"context"
	"strings"
	"testing"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	criann "github.com/crisp-runtime/crisp/api/annotations"
	options "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/config"
)

func TestRuntimeOptions(t *testing.T) {
	cases := []struct {
		name    string
		shim    string
		table   map[string]any
		systemd bool
		check   func(t *testing.T, data []byte, typeURL string)
		wantErr string
	}{
		{name: "runc defaults", shim: "/usr/bin/containerd-shim-runc-v2", check: func(t *testing.T, data []byte, typeURL string) {
			var o runcoptions.Options
			if err := proto.Unmarshal(data, &o); err != nil || typeURL != "containerd.runc.v1.Options" {
				t.Fatalf("%s: %v", typeURL, err)
			}
			if o.Root != "/run/crisp/runc" || o.SystemdCgroup || o.BinaryName != "" {
				t.Errorf("options %+v: want crisp's runc root, cgroupfs, runc from PATH", &o)
			}
		}},
		{name: "runc keys by Go and proto name", shim: "containerd-shim-runc-v2", systemd: true,
			table: map[string]any{"BinaryName": "/opt/runc", "root": "/r", "io_uid": int64(1000), "NoPivotRoot": true},
			check: func(t *testing.T, data []byte, _ string) {
				var o runcoptions.Options
				_ = proto.Unmarshal(data, &o)
				if o.BinaryName != "/opt/runc" || o.Root != "/r" || o.IoUid != 1000 || !o.NoPivotRoot || !o.SystemdCgroup {
					t.Errorf("options %+v", &o)
				}
			}},
		{name: "systemd driver overridden", shim: "containerd-shim-runc-v2", systemd: true, table: map[string]any{"SystemdCgroup": false},
			check: func(t *testing.T, data []byte, _ string) {
				var o runcoptions.Options
				_ = proto.Unmarshal(data, &o)
				if o.SystemdCgroup {
					t.Errorf("SystemdCgroup = true, want the table's false")
				}
			}},
		{name: "generic shim", shim: "containerd-shim-runsc-v1", table: map[string]any{"TypeUrl": "io.containerd.runsc.v1.options", "ConfigPath": "/etc/runsc.toml"},
			check: func(t *testing.T, data []byte, typeURL string) {
				var o runtimeoptions.Options
				if err := proto.Unmarshal(data, &o); err != nil || typeURL != "runtimeoptions.v1.Options" {
					t.Fatalf("%s: %v", typeURL, err)
				}
				if o.TypeUrl != "io.containerd.runsc.v1.options" || o.ConfigPath != "/etc/runsc.toml" {
					t.Errorf("options %+v", &o)
				}
			}},
		{name: "unknown key", shim: "containerd-shim-runc-v2", table: map[string]any{"BinaryNmae": "x"}, wantErr: `unknown key "BinaryNmae"`},
		{name: "wrong type", shim: "containerd-shim-runc-v2", table: map[string]any{"SystemdCgroup": "yes"}, wantErr: "SystemdCgroup: want a bool"},
		{name: "negative uid", shim: "containerd-shim-runc-v2", table: map[string]any{"IoUid": int64(-1)}, wantErr: "IoUid: want a uint32"},
		{name: "kata key on runc", shim: "containerd-shim-runc-v2", table: map[string]any{"ConfigPath": "/x"}, wantErr: "unknown key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := RuntimeOptions("h", config.Runtime{Shim: tc.shim, SandboxMode: "task", Options: tc.table}, "/run/crisp", tc.systemd)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "runtimes.h.options") {
					t.Fatalf("err = %v, want %q naming the key", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, a.GetValue(), a.GetTypeUrl())
		})
	}
}

func nsTypes(s *specs.Spec) map[specs.LinuxNamespaceType]string {
	out := map[specs.LinuxNamespaceType]string{}
	for _, ns := range s.Linux.Namespaces {
		out[ns.Type] = ns.Path
	}
	return out
}

func TestPauseSpec(t *testing.T) {
	base := PauseBundle{ID: "p1", Name: "web", Namespace: "default", UID: "u1", NetNS: "/run/crisp/netns/p1",
		Binary: "/usr/bin/shim-runc", CgroupsPath: "/kubepods/pod1/crisp-p1", Annotations: map[string]string{"a": "b", criann.SandboxID: "forged"}}
	t.Run("pod namespaces", func(t *testing.T) {
		p := base
		p.Options = &options.SandboxOptions{Hostname: "web", Sysctls: map[string]string{"net.ipv4.ip_unprivileged_port_start": "0"}, OomScoreAdj: -998}
		s, err := p.spec()
		if err != nil {
			t.Fatal(err)
		}
		ns := nsTypes(s)
		if ns[specs.NetworkNamespace] != p.NetNS || len(ns) != 5 {
			t.Errorf("namespaces %v: want the pod's netns and new mount, pid, ipc, uts", ns)
		}
		if s.Hostname != "web" || s.Linux.Sysctl["net.ipv4.ip_unprivileged_port_start"] != "0" || s.Linux.CgroupsPath != p.CgroupsPath {
			t.Errorf("hostname %q sysctls %v cgroup %q", s.Hostname, s.Linux.Sysctl, s.Linux.CgroupsPath)
		}
		if s.Process.Args[0] != pausePath || s.Process.User.UID != pauseUID || !s.Process.NoNewPrivileges || *s.Process.OOMScoreAdj != -998 {
			t.Errorf("process %+v", s.Process)
		}
		if s.Mounts[0].Source != p.Binary || s.Mounts[0].Destination != pausePath || !s.Root.Readonly {
			t.Errorf("the shim binary must be the read-only rootfs's only file: mounts %+v root %+v", s.Mounts, s.Root)
		}
		a := s.Annotations
		if a[criann.ContainerType] != "sandbox" || a[criann.SandboxID] != "p1" || a[criann.SandboxName] != "web" || a["a"] != "b" {
			t.Errorf("annotations %v: containerd's, set over the pod's", a)
		}
	})
	t.Run("host namespaces", func(t *testing.T) {
		p := base
		p.NetNS = ""
		p.Options = &options.SandboxOptions{Hostname: "node", Network: options.NamespaceMode_NODE, Pid: options.NamespaceMode_NODE, Ipc: options.NamespaceMode_NODE, Uts: options.NamespaceMode_NODE}
		s, err := p.spec()
		if err != nil {
			t.Fatal(err)
		}
		if ns := nsTypes(s); len(ns) != 1 || s.Hostname != "" {
			t.Errorf("namespaces %v hostname %q: want only a mount namespace, the host's name", ns, s.Hostname)
		}
	})
	t.Run("user namespace refused", func(t *testing.T) {
		p := base
		p.Options = &options.SandboxOptions{Userns: &options.UserNamespace{}}
		if _, err := p.spec(); !errdefs.IsNotImplemented(err) {
			t.Errorf("err = %v, want NotImplemented", err)
		}
	})
}

func TestTaskV2RewritesService(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{taskServiceV3, taskServiceV2},
		{"containerd.runtime.sandbox.v1.Sandbox", "containerd.runtime.sandbox.v1.Sandbox"},
	} {
		req := &ttrpc.Request{Service: tc.in, Method: "State"}
		var got string
		_ = TaskV2(context.Background(), req, &ttrpc.Response{}, nil, func(_ context.Context, r *ttrpc.Request, _ *ttrpc.Response) error {
			got = r.Service
			return nil
		})
		if got != tc.want {
			t.Errorf("%s called as %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestRemoveEmptyCgroupRefusesOddPaths(t *testing.T) {
	for _, p := range []string{"", "/", "kubepods.slice:crisp:abc", "relative/path", "/a/../b"} {
		if n := removeEmptyCgroup(p); n != 0 {
			t.Errorf("removeEmptyCgroup(%q) removed %d", p, n)
		}
	}
}
