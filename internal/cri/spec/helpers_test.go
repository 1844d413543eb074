package spec

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const testPasswd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
alice:x:1000:1000:Alice:/home/alice:/bin/sh
bob:x:1001:100:Bob:/home/bob:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
`

const testGroup = `root:x:0:root
daemon:x:1:
users:x:100:alice
alice:x:1000:alice
video:x:44:alice,bob
audio:x:29:bob
wheel:x:10:root
nogroup:x:65534:
`

// host describes the host facts Generate reads; setHost installs it for one test.
type host struct {
	cgroup2, swap, hugetlb bool
	propagation            string // mountinfo optional fields of every mount
	caps                   []string
	devices                []specs.LinuxDevice
}

func defaultHost() host {
	return host{
		cgroup2:     true,
		swap:        true,
		hugetlb:     true,
		propagation: "shared:1",
		caps:        []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_KILL", "CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_SETUID"},
		devices:     []specs.LinuxDevice{{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}, {Path: "/dev/sda", Type: "b", Major: 8, Minor: 0}},
	}
}

// setHost replaces the host probes for the duration of a test (tests using it must
// not run in parallel).
func setHost(t *testing.T, h host) {
	t.Helper()
	oldCg, oldSwap, oldHuge, oldLookup, oldCaps, oldDevs, oldHostname, oldThrottle :=
		cgroup2, swapAvailable, hugetlbAvailable, lookupMount, allCapabilities, hostDevices, osHostname, throttlePaths
	t.Cleanup(func() {
		cgroup2, swapAvailable, hugetlbAvailable, lookupMount, allCapabilities, hostDevices, osHostname, throttlePaths =
			oldCg, oldSwap, oldHuge, oldLookup, oldCaps, oldDevs, oldHostname, oldThrottle
	})
	cgroup2 = func() bool { return h.cgroup2 }
	swapAvailable = func() bool { return h.swap }
	hugetlbAvailable = func() bool { return h.hugetlb }
	lookupMount = func(p string) (*mountinfo.Info, error) {
		return &mountinfo.Info{Mountpoint: "/", Optional: h.propagation, VFSOptions: "rw,nsdelegate,memory_recursiveprot"}, nil
	}
	allCapabilities = func() ([]string, error) { return slices.Clone(h.caps), nil }
	hostDevices = func() ([]specs.LinuxDevice, error) { return slices.Clone(h.devices), nil }
	osHostname = func() (string, error) { return "node-1", nil }
	throttlePaths = func() []string { return []string{"/sys/devices/system/cpu/cpu0/thermal_throttle"} }
}

// writeRootfs makes a rootfs with the given etc/passwd and etc/group ("" = no file).
func writeRootfs(t *testing.T, passwd, group string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"passwd": passwd, "group": group} {
		if content == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(root, "etc", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// baseInput is a typical kubelet request: own network and IPC, pid CONTAINER
// (shareProcessNamespace: false), image busybox-like.
func baseInput(t *testing.T) Input {
	t.Helper()
	nsOpts := func() *runtime.NamespaceOption {
		return &runtime.NamespaceOption{Network: runtime.NamespaceMode_POD, Pid: runtime.NamespaceMode_CONTAINER, Ipc: runtime.NamespaceMode_POD}
	}
	return Input{
		ContainerID: "c1",
		SandboxID:   "p1",
		Config: &runtime.ContainerConfig{
			Metadata: &runtime.ContainerMetadata{Name: "app"},
			Image:    &runtime.ImageSpec{Image: "sha256:abc", UserSpecifiedImage: "busybox"},
			Linux: &runtime.LinuxContainerConfig{
				SecurityContext: &runtime.LinuxContainerSecurityContext{NamespaceOptions: nsOpts()},
			},
		},
		Pod: &runtime.PodSandboxConfig{
			Metadata: &runtime.PodSandboxMetadata{Name: "pod", Namespace: "default", Uid: "uid-1"},
			Hostname: "pod-host",
			Linux: &runtime.LinuxPodSandboxConfig{
				SecurityContext: &runtime.LinuxSandboxSecurityContext{NamespaceOptions: nsOpts()},
			},
		},
		Image:            ocispec.Image{Config: ocispec.ImageConfig{Cmd: []string{"sh"}}},
		RootfsPath:       writeRootfs(t, testPasswd, testGroup),
		PausePid:         100,
		NetNSPath:        "/run/crisp/netns/p1",
		OOMScoreAdjFloor: -1000,
		// Set as on any kernel since 5.12; TestRecursiveReadOnlyUnsupported clears it.
		RecursiveReadOnlyMounts: true,
	}
}

func sc(in Input) *runtime.LinuxContainerSecurityContext {
	return in.Config.Linux.SecurityContext
}

// mustGenerate runs Generate, fails on error and checks the spec is sane.
func mustGenerate(t *testing.T, in Input) *Result {
	t.Helper()
	res, err := Generate(in)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	checkSane(t, res.Spec)
	return res
}

// checkSane round-trips the spec through JSON (what the bundle's config.json holds)
// and checks what runc insists on.
func checkSane(t *testing.T, s *specs.Spec) {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("marshal spec: %v", err)
	}
	var back specs.Spec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("unmarshal spec: %v", err)
	}
	b2, _ := json.Marshal(&back)
	if string(b) != string(b2) {
		t.Fatalf("spec does not round-trip through JSON:\n%s\n%s", b, b2)
	}
	if s.Version != specs.Version {
		t.Errorf("version %q", s.Version)
	}
	if s.Root == nil || s.Root.Path != "rootfs" {
		t.Errorf("root %+v, want path rootfs", s.Root)
	}
	if s.Process == nil || !path.IsAbs(s.Process.Cwd) || len(s.Process.Args) == 0 {
		t.Fatalf("process %+v: want absolute cwd and args", s.Process)
	}
	if s.Linux == nil || s.Linux.CgroupsPath == "" {
		t.Fatalf("linux %+v: want a cgroups path", s.Linux)
	}
	seen := map[string]bool{}
	for _, m := range s.Mounts {
		if !path.IsAbs(m.Destination) {
			t.Errorf("mount destination %q is not absolute", m.Destination)
		}
		if seen[m.Destination] {
			t.Errorf("two mounts at %s", m.Destination)
		}
		seen[m.Destination] = true
	}
	// Parents before children.
	for i, m := range s.Mounts {
		for _, later := range s.Mounts[i+1:] {
			if strings.HasPrefix(m.Destination, later.Destination+"/") {
				t.Errorf("mount %s comes before its parent %s", m.Destination, later.Destination)
			}
		}
	}
	ns := map[specs.LinuxNamespaceType]bool{}
	for _, n := range s.Linux.Namespaces {
		if ns[n.Type] {
			t.Errorf("namespace %s twice", n.Type)
		}
		ns[n.Type] = true
	}
	if !ns[specs.MountNamespace] {
		t.Errorf("no mount namespace")
	}
}

func wantErr(t *testing.T, err error, is func(error) bool, contains string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error containing %q, got none", contains)
	}
	if !is(err) {
		t.Errorf("error %q has the wrong kind", err)
	}
	if !strings.Contains(err.Error(), contains) {
		t.Errorf("error %q does not contain %q", err, contains)
	}
}

func findMount(s *specs.Spec, dst string) *specs.Mount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dst {
			return &s.Mounts[i]
		}
	}
	return nil
}

func equal[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", what, got, want)
	}
}

var (
	isInvalid            = errdefs.IsInvalidArgument
	isFailedPrecondition = errdefs.IsFailedPrecondition
	isNotFound           = errdefs.IsNotFound
	isNotImplemented     = errdefs.IsNotImplemented
)
