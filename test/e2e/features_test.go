package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// rroVolume makes dir/rrovol, a host tree with a writable tmpfs submount at sub,
// unmounted when the test ends.
func rroVolume(t *testing.T, dir string) (vol, sub string) {
	t.Helper()
	vol = filepath.Join(dir, "rrovol")
	sub = filepath.Join(vol, "sub")
	if err := os.MkdirAll(sub, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
		t.Fatalf("mount tmpfs submount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(sub, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", sub, err)
		}
	})
	return vol, sub
}

// TestE2ERecursiveReadOnlyAndFeatures: Status advertises recursive read-only mounts
// for every handler and the supplemental groups policy; a recursive read-only mount
// of a host tree with a submount makes the submount read-only in the container, while
// a plain read-only mount of the same tree leaves it writable; bad combinations are
// InvalidArgument; SupplementalGroupsPolicy Merge adds the image's groups and Strict
// does not, and ContainerStatus.user reports what the process got.
func TestE2ERecursiveReadOnlyAndFeatures(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)

	st, err := e.rt.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !st.GetFeatures().GetSupplementalGroupsPolicy() {
		t.Errorf("Status features: %v, want supplemental_groups_policy", st.GetFeatures())
	}
	var names []string
	for _, h := range st.RuntimeHandlers {
		names = append(names, h.Name)
		if !h.GetFeatures().GetRecursiveReadOnlyMounts() {
			t.Errorf("handler %q: recursive_read_only_mounts not advertised (kernel 5.12+ has mount_setattr)", h.Name)
		}
		if !h.GetFeatures().GetUserNamespaces() {
			t.Errorf("handler %q does not advertise user namespaces (kernel 6.18 idmaps overlay layers)", h.Name)
		}
	}
	if !slices.Contains(names, "runc") || !slices.Contains(names, "") {
		t.Errorf("runtime handlers %q, want runc and the default (\"\")", names)
	}

	vol, sub := rroVolume(t, e.dir)

	// An image whose /etc/group puts user app in group extra.
	host := imagetest.StartRegistry(t)
	img := imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{Cmd: []string{"/bin/sh"}}},
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.BusyboxEntries(t)...),
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip,
			imagetest.File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/:/bin/sh\n"),
			imagetest.File("etc/group", "root:x:0:\napp:x:1000:\nextra:x:2000:app\n")))
	imagetest.Push(t, host, "feat/busybox:1", img)
	ref := host + "/feat/busybox:1"
	if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}

	pod := e.podConfig("rro")
	podID := e.runPod(ctx, pod)

	// Bad combinations are refused before anything is created.
	for _, bad := range []struct {
		name string
		m    *cri.Mount
		want string
	}{
		{"rro-without-readonly", &cri.Mount{HostPath: vol, ContainerPath: "/v", RecursiveReadOnly: true}, "recursive_read_only needs readonly"},
		{"rro-host-to-container", &cri.Mount{HostPath: vol, ContainerPath: "/v", Readonly: true, RecursiveReadOnly: true,
			Propagation: cri.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}, "recursive_read_only needs PRIVATE propagation, not PROPAGATION_HOST_TO_CONTAINER"},
		{"rro-bidirectional", &cri.Mount{HostPath: vol, ContainerPath: "/v", Readonly: true, RecursiveReadOnly: true,
			Propagation: cri.MountPropagation_PROPAGATION_BIDIRECTIONAL}, "recursive_read_only needs PRIVATE propagation, not PROPAGATION_BIDIRECTIONAL"},
	} {
		cfg := ctrConfig(bad.name, ref, "true")
		cfg.Mounts = []*cri.Mount{bad.m}
		_, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want InvalidArgument %q", bad.name, err, bad.want)
		}
	}

	cfg := ctrConfig("mounts", ref, "sleep", "1000")
	cfg.Mounts = []*cri.Mount{
		{HostPath: vol, ContainerPath: "/rro", Readonly: true, RecursiveReadOnly: true},
		{HostPath: vol, ContainerPath: "/ro", Readonly: true},
	}
	id := e.runCtr(ctx, podID, pod, cfg)
	write := func(path string) string {
		t.Helper()
		resp, err := e.execSync(ctx, id, 10, "sh", "-c", "echo x > "+path+" 2>&1 && echo WROTE")
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		return strings.TrimSpace(string(resp.Stdout) + string(resp.Stderr))
	}
	// The plain read-only mount: its top is read-only but the submount is not (the
	// gap recursive read-only closes), so this half of the test fails if "ro" ever
	// became recursive by accident and the other half means something.
	if got := write("/ro/top"); !strings.Contains(got, "Read-only file system") {
		t.Errorf("write to the top of a read-only mount: %q", got)
	}
	if got := write("/ro/sub/plain"); got != "WROTE" {
		t.Errorf("write under the submount of a plain read-only mount: %q, want it to succeed", got)
	}
	if data, err := os.ReadFile(filepath.Join(sub, "plain")); err != nil || string(data) != "x\n" {
		t.Errorf("the host's submount does not hold the write: %q %v", data, err)
	}
	// The recursive read-only mount: both are read-only (EROFS).
	if got := write("/rro/top"); !strings.Contains(got, "Read-only file system") {
		t.Errorf("write to the top of a recursive read-only mount: %q", got)
	}
	if got := write("/rro/sub/rec"); !strings.Contains(got, "Read-only file system") {
		t.Errorf("write under the submount of a recursive read-only mount: %q, want EROFS", got)
	}
	if _, err := os.Stat(filepath.Join(sub, "rec")); err == nil {
		t.Error("a write through the recursive read-only mount reached the host")
	}
	resp, err := e.execSync(ctx, id, 10, "cat", "/rro/sub/plain")
	if err != nil || string(resp.Stdout) != "x\n" {
		t.Errorf("read through the recursive read-only mount: %q %v", resp.GetStdout(), err)
	}

	// Supplemental groups: Merge (the default) and Strict.
	for _, tc := range []struct {
		policy cri.SupplementalGroupsPolicy
		want   []int64
	}{
		{cri.SupplementalGroupsPolicy_Merge, []int64{1000, 2000, 3000}},
		{cri.SupplementalGroupsPolicy_Strict, []int64{1000, 3000}},
	} {
		name := "groups-" + strings.ToLower(tc.policy.String())
		cfg := ctrConfig(name, ref, "sleep", "1000")
		cfg.Linux.SecurityContext.RunAsUsername = "app"
		cfg.Linux.SecurityContext.SupplementalGroups = []int64{3000}
		cfg.Linux.SecurityContext.SupplementalGroupsPolicy = tc.policy
		cid := e.runCtr(ctx, podID, pod, cfg)
		resp, err := e.execSync(ctx, cid, 10, "id", "-G")
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, f := range strings.Fields(string(resp.Stdout)) {
			g, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("%s: id -G printed %q", name, resp.Stdout)
			}
			got = append(got, g)
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: id -G = %q, want %v", name, resp.Stdout, tc.want)
		}
		cs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: cid})
		if err != nil {
			t.Fatal(err)
		}
		u := cs.GetStatus().GetUser().GetLinux()
		if u.GetUid() != 1000 || u.GetGid() != 1000 || !slices.Equal(u.GetSupplementalGroups(), tc.want) {
			t.Errorf("%s: ContainerStatus.user %v, want uid 1000 gid 1000 groups %v", name, u, tc.want)
		}
	}

	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}
