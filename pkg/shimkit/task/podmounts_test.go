package task

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/crisp-runtime/crisp/api/annotations"
	"github.com/crisp-runtime/crisp/internal/podfiles"
)

func TestAddPodMounts(t *testing.T) {
	files := podfiles.In("/run/b/pod", true)
	ann := map[string]string{annotations.ContainerType: annotations.ContainerTypeContainer, annotations.SandboxID: "pod1"}
	defShm := specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}
	proc := specs.Mount{Destination: "/proc", Type: "proc", Source: "proc"}
	podIPC := &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.IPCNamespace, Path: "/proc/1/ns/ipc"}}}
	bind := func(dst, src, mode string) specs.Mount {
		return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", mode}}
	}
	all := func(mode string) []specs.Mount {
		return []specs.Mount{proc, bind("/dev/shm", files.Shm, "rw"),
			bind("/etc/hostname", files.Hostname, mode), bind("/etc/hosts", files.Hosts, mode), bind("/etc/resolv.conf", files.Resolv, mode)}
	}
	tests := []struct {
		name      string
		spec      specs.Spec
		files     podfiles.Paths
		want      []specs.Mount
		unchanged bool
	}{{
		name:  "containerd's default spec",
		spec:  specs.Spec{Annotations: ann, Root: &specs.Root{Path: "rootfs"}, Linux: podIPC, Mounts: []specs.Mount{proc, defShm}},
		files: files,
		want:  all("rw"),
	}, {
		name:  "read-only rootfs",
		spec:  specs.Spec{Annotations: ann, Root: &specs.Root{Path: "rootfs", Readonly: true}, Linux: podIPC, Mounts: []specs.Mount{proc, defShm}},
		files: files,
		want:  all("ro"),
	}, {
		name:  "kubelet's /etc/hosts and a memory volume at /dev/shm stay",
		spec:  specs.Spec{Annotations: ann, Root: &specs.Root{Path: "rootfs"}, Linux: podIPC, Mounts: []specs.Mount{proc, bind("/dev/shm/", "/vol", "rw"), bind("/etc/hosts", "/kubelet/hosts", "rw")}},
		files: files,
		want: []specs.Mount{proc, bind("/dev/shm/", "/vol", "rw"), bind("/etc/hosts", "/kubelet/hosts", "rw"),
			bind("/etc/hostname", files.Hostname, "rw"), bind("/etc/resolv.conf", files.Resolv, "rw")},
	}, {
		name:  "host IPC keeps its own /dev/shm",
		spec:  specs.Spec{Annotations: ann, Root: &specs.Root{Path: "rootfs"}, Linux: &specs.Linux{}, Mounts: []specs.Mount{proc, defShm}},
		files: files,
		want: []specs.Mount{proc, defShm,
			bind("/etc/hostname", files.Hostname, "rw"), bind("/etc/hosts", files.Hosts, "rw"), bind("/etc/resolv.conf", files.Resolv, "rw")},
	}, {
		name:      "a container of another sandbox",
		spec:      specs.Spec{Annotations: map[string]string{annotations.ContainerType: annotations.ContainerTypeContainer, annotations.SandboxID: "pod2"}, Root: &specs.Root{Path: "rootfs"}, Linux: podIPC, Mounts: []specs.Mount{proc, defShm}},
		files:     files,
		unchanged: true,
	}, {
		name:      "the sandbox container",
		spec:      specs.Spec{Annotations: map[string]string{annotations.ContainerType: "sandbox", annotations.SandboxID: "pod1"}, Root: &specs.Root{Path: "rootfs"}, Linux: podIPC, Mounts: []specs.Mount{proc, defShm}},
		files:     files,
		unchanged: true,
	}, {
		name:      "everything mounted already",
		spec:      specs.Spec{Annotations: ann, Root: &specs.Root{Path: "rootfs"}, Linux: podIPC, Mounts: all("rw")},
		files:     files,
		unchanged: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bundle := t.TempDir()
			data, err := json.Marshal(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			// A field the OCI types here do not know must survive the rewrite.
			data = append(data[:len(data)-1], []byte(`,"futureField":{"x":1}}`)...)
			path := filepath.Join(bundle, specFile)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			changed, err := addPodMounts(bundle, "pod1", tt.files)
			if err != nil {
				t.Fatal(err)
			}
			out, _ := os.ReadFile(path)
			if tt.unchanged {
				if changed || string(out) != string(data) {
					t.Fatalf("spec changed (%v):\n%s", changed, out)
				}
				return
			}
			var got specs.Spec
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal(out, &raw)
			if !changed || !reflect.DeepEqual(got.Mounts, tt.want) {
				t.Errorf("mounts (changed %v):\n got %+v\nwant %+v", changed, got.Mounts, tt.want)
			}
			if string(raw["futureField"]) != `{"x":1}` {
				t.Errorf("unknown field lost: %s", out)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
				t.Errorf("mode %v, want 0600", fi.Mode())
			}
		})
	}
}
