package spec

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

func destinations(ms []specs.Mount) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Destination)
	}
	return out
}

func TestDefaultMounts(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	res := mustGenerate(t, in)
	equal(t, "mounts", destinations(res.Spec.Mounts),
		[]string{"/proc", "/dev", "/sys", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys/fs/cgroup"})
	equal(t, "sysfs", findMount(res.Spec, "/sys").Options, []string{"nosuid", "noexec", "nodev", "ro"})
	// cgroup v2 with a cgroup namespace: the container's own view, no host options.
	equal(t, "cgroup", findMount(res.Spec, "/sys/fs/cgroup").Options, []string{"nosuid", "noexec", "nodev", "relatime", "ro"})
	equal(t, "shm", findMount(res.Spec, "/dev/shm").Type, "tmpfs")

	// Privileged: sysfs and cgroupfs writable; no cgroup namespace, so the host's
	// cgroup2 superblock options are kept.
	in.Pod.Linux.SecurityContext.Privileged = true
	sc(in).Privileged = true
	res = mustGenerate(t, in)
	equal(t, "privileged sysfs", findMount(res.Spec, "/sys").Options, []string{"nosuid", "noexec", "nodev", "rw"})
	equal(t, "privileged cgroup", findMount(res.Spec, "/sys/fs/cgroup").Options,
		[]string{"nosuid", "noexec", "nodev", "relatime", "rw", "nsdelegate", "memory_recursiveprot"})
}

func TestPodFilesAndShm(t *testing.T) {
	setHost(t, defaultHost())
	podDir := t.TempDir()
	for _, f := range []string{"hostname", "hosts", "resolv.conf"} {
		if err := os.WriteFile(filepath.Join(podDir, f), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shm := t.TempDir()
	kubeletHosts := filepath.Join(t.TempDir(), "etc-hosts")
	if err := os.WriteFile(kubeletHosts, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	in := baseInput(t)
	in.PodFilesDir, in.ShmPath = podDir, shm
	res := mustGenerate(t, in)
	for _, pf := range []struct{ dst, src string }{
		{"/etc/hostname", filepath.Join(podDir, "hostname")},
		{"/etc/hosts", filepath.Join(podDir, "hosts")},
		{"/etc/resolv.conf", filepath.Join(podDir, "resolv.conf")},
		{"/dev/shm", shm},
	} {
		m := findMount(res.Spec, pf.dst)
		if m == nil {
			t.Fatalf("no mount at %s", pf.dst)
		}
		equal(t, pf.dst, *m, specs.Mount{Destination: pf.dst, Type: "bind", Source: pf.src, Options: []string{"rbind", "rprivate", "rw"}})
	}

	// Read-only rootfs: pod files read-only too (containerd); kubelet's own /etc/hosts
	// replaces the pod's; a missing pod file is skipped.
	sc(in).ReadonlyRootfs = true
	in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/etc/hosts", HostPath: kubeletHosts}}
	if err := os.Remove(filepath.Join(podDir, "hostname")); err != nil {
		t.Fatal(err)
	}
	res = mustGenerate(t, in)
	if !res.Spec.Root.Readonly {
		t.Error("root not read-only")
	}
	if m := findMount(res.Spec, "/etc/hostname"); m != nil {
		t.Errorf("missing pod hostname file mounted: %+v", m)
	}
	equal(t, "hosts source", findMount(res.Spec, "/etc/hosts").Source, kubeletHosts)
	equal(t, "resolv.conf", findMount(res.Spec, "/etc/resolv.conf").Options, []string{"rbind", "rprivate", "ro"})

	// Host IPC shares the host's /dev/shm.
	in = baseInput(t)
	in.ShmPath = shm
	in.Pod.Linux.SecurityContext.NamespaceOptions.Ipc = runtime.NamespaceMode_NODE
	equal(t, "host ipc shm", findMount(mustGenerate(t, in).Spec, "/dev/shm").Source, "/dev/shm")

	in = baseInput(t)
	in.ShmPath = filepath.Join(t.TempDir(), "gone")
	_, err := Generate(in)
	wantErr(t, err, isInvalid, "pod shm path")
}

func TestCRIMounts(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	data, logs := mk("data"), mk("logs")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(data, link); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")

	for _, tc := range []struct {
		name        string
		propagation string // host mount propagation
		mounts      []*runtime.Mount
		want        []specs.Mount // the bind mounts, in order
		wantRoot    string
		wantErr     string
		errIs       func(error) bool
	}{
		{
			name: "private rw and readonly, sorted parents first, symlink resolved",
			mounts: []*runtime.Mount{
				{ContainerPath: "/var/lib/data/sub", HostPath: logs, Readonly: true},
				{ContainerPath: "/var/lib/data", HostPath: link},
			},
			want: []specs.Mount{
				{Destination: "/var/lib/data", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "rw"}},
				{Destination: "/var/lib/data/sub", Type: "bind", Source: logs, Options: []string{"rbind", "rprivate", "ro"}},
			},
		},
		{
			name:        "host to container is rslave on a shared host mount",
			propagation: "shared:5",
			mounts:      []*runtime.Mount{{ContainerPath: "/mnt", HostPath: data, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}},
			want:        []specs.Mount{{Destination: "/mnt", Type: "bind", Source: data, Options: []string{"rbind", "rslave", "rw"}}},
			wantRoot:    "rslave",
		},
		{
			name:        "host to container accepts a slave host mount",
			propagation: "master:3",
			mounts:      []*runtime.Mount{{ContainerPath: "/mnt", HostPath: data, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER, Readonly: true}},
			want:        []specs.Mount{{Destination: "/mnt", Type: "bind", Source: data, Options: []string{"rbind", "rslave", "ro"}}},
			wantRoot:    "rslave",
		},
		{
			name:        "bidirectional is rshared and makes the root rshared",
			propagation: "shared:5",
			mounts: []*runtime.Mount{
				{ContainerPath: "/a", HostPath: data, Propagation: runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL},
				{ContainerPath: "/b", HostPath: logs, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
			},
			want: []specs.Mount{
				{Destination: "/a", Type: "bind", Source: data, Options: []string{"rbind", "rshared", "rw"}},
				{Destination: "/b", Type: "bind", Source: logs, Options: []string{"rbind", "rslave", "rw"}},
			},
			wantRoot: "rshared",
		},
		{
			name:        "bidirectional needs a shared host mount",
			propagation: "master:3",
			mounts:      []*runtime.Mount{{ContainerPath: "/a", HostPath: data, Propagation: runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL}},
			wantErr:     "which is not shared: BIDIRECTIONAL",
			errIs:       errdefs.IsFailedPrecondition,
		},
		{
			name:    "host to container needs a shared or slave host mount",
			mounts:  []*runtime.Mount{{ContainerPath: "/a", HostPath: data, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}},
			wantErr: "not shared or slave",
			errIs:   errdefs.IsFailedPrecondition,
		},
		{
			name:   "recursive read-only and mount options",
			mounts: []*runtime.Mount{{ContainerPath: "/ro", HostPath: data, Readonly: true, RecursiveReadOnly: true, MountOptions: []string{"noexec", "nosuid", "noexec"}, SelinuxRelabel: true}},
			want:   []specs.Mount{{Destination: "/ro", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "rro", "noexec", "nosuid"}}},
		},
		{
			name:    "recursive read-only needs readonly",
			mounts:  []*runtime.Mount{{ContainerPath: "/ro", HostPath: data, RecursiveReadOnly: true}},
			wantErr: "mount at /ro (host path " + data + "): recursive_read_only needs readonly",
		},
		{
			name:        "recursive read-only needs private propagation (host to container)",
			propagation: "shared:5",
			mounts:      []*runtime.Mount{{ContainerPath: "/ro", HostPath: data, Readonly: true, RecursiveReadOnly: true, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}},
			wantErr:     "recursive_read_only needs PRIVATE propagation, not PROPAGATION_HOST_TO_CONTAINER",
		},
		{
			name:        "recursive read-only needs private propagation (bidirectional)",
			propagation: "shared:5",
			mounts:      []*runtime.Mount{{ContainerPath: "/ro", HostPath: data, Readonly: true, RecursiveReadOnly: true, Propagation: runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL}},
			wantErr:     "recursive_read_only needs PRIVATE propagation, not PROPAGATION_BIDIRECTIONAL",
		},
		{
			name:    "unsupported mount option",
			mounts:  []*runtime.Mount{{ContainerPath: "/x", HostPath: data, MountOptions: []string{"suid"}}},
			wantErr: `mount option "suid" is not supported`,
		},
		{
			name:    "missing host path is named",
			mounts:  []*runtime.Mount{{ContainerPath: "/data", HostPath: missing}},
			wantErr: `mount host_path "` + missing + `" (for /data) does not exist on the host`,
		},
		{
			name:    "relative container path",
			mounts:  []*runtime.Mount{{ContainerPath: "data", HostPath: data}},
			wantErr: `container_path "data" must be an absolute path`,
		},
		{
			name:    "duplicate destination",
			mounts:  []*runtime.Mount{{ContainerPath: "/d", HostPath: data}, {ContainerPath: "/d/", HostPath: logs}},
			wantErr: "two mounts have the container path /d",
		},
		{
			name:    "image volume without host path",
			mounts:  []*runtime.Mount{{ContainerPath: "/models", Image: &runtime.ImageSpec{Image: "example.com/models:1"}}},
			wantErr: "image volumes (example.com/models:1) are not supported",
			errIs:   isNotImplemented,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := defaultHost()
			h.propagation = tc.propagation
			setHost(t, h)
			in := baseInput(t)
			in.Config.Mounts = tc.mounts
			if tc.wantErr != "" {
				_, err := Generate(in)
				is := tc.errIs
				if is == nil {
					is = isInvalid
				}
				wantErr(t, err, is, tc.wantErr)
				return
			}
			res := mustGenerate(t, in)
			var binds []specs.Mount
			for _, m := range res.Spec.Mounts {
				if m.Type == "bind" {
					binds = append(binds, m)
				}
			}
			equal(t, "bind mounts", binds, tc.want)
			equal(t, "rootfs propagation", res.Spec.Linux.RootfsPropagation, tc.wantRoot)
		})
	}
}

// TestRecursiveReadOnlyUnsupported: on a kernel without mount_setattr a
// recursive_read_only mount is refused (FailedPrecondition, the node cannot do it),
// while a plain read-only mount still works.
func TestRecursiveReadOnlyUnsupported(t *testing.T) {
	setHost(t, defaultHost())
	data := t.TempDir()
	in := baseInput(t)
	in.RecursiveReadOnlyMounts = false
	in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/ro", HostPath: data, Readonly: true, RecursiveReadOnly: true}}
	_, err := Generate(in)
	wantErr(t, err, errdefs.IsFailedPrecondition, "recursive_read_only needs mount_setattr")

	in.Config.Mounts[0].RecursiveReadOnly = false
	res := mustGenerate(t, in)
	for _, m := range res.Spec.Mounts {
		if m.Destination == "/ro" && !slices.Equal(m.Options, []string{"rbind", "rprivate", "ro"}) {
			t.Errorf("plain read-only mount options %v", m.Options)
		}
	}
}

// TestRecursiveReadOnlyProbe checks the probe against the running kernel's version:
// mount_setattr arrived in Linux 5.12.
func TestRecursiveReadOnlyProbe(t *testing.T) {
	testutil.RequiresRoot(t, "mount_setattr answers EPERM, which the probe reads as unsupported, without CAP_SYS_ADMIN")
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", uts.Release, err)
	}
	want := major > 5 || (major == 5 && minor >= 12)
	if got := RecursiveReadOnlySupported(); got != want {
		t.Errorf("RecursiveReadOnlySupported() = %v on Linux %d.%d, want %v", got, major, minor, want)
	}
}

func TestUserMountsWinOverDefaults(t *testing.T) {
	setHost(t, defaultHost())
	dev, shm := t.TempDir(), t.TempDir()
	in := baseInput(t)
	in.ShmPath = shm
	in.Config.Mounts = []*runtime.Mount{
		{ContainerPath: "/proc/sys/x", HostPath: t.TempDir()},
		{ContainerPath: "/dev", HostPath: dev},
		{ContainerPath: "/sys", HostPath: t.TempDir()},
	}
	res := mustGenerate(t, in)
	// /dev is the user's and every default below it goes; so does /sys, and the
	// default /sys/fs/cgroup moves behind the user's /sys.
	equal(t, "mounts", destinations(res.Spec.Mounts),
		[]string{"/proc", "/dev", "/sys", "/dev/shm", "/sys/fs/cgroup", "/proc/sys/x"})
	equal(t, "dev", findMount(res.Spec, "/dev").Source, dev)
	equal(t, "sys", findMount(res.Spec, "/sys").Type, "bind")
}
