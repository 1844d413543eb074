package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/store"
)

// pushDataImage pushes and pulls a two-layer data image (an overlay of lower dirs when
// mounted) and returns its tag and ID.
func (e *env) pushDataImage(ctx context.Context) (ref, id string) {
	e.t.Helper()
	t := e.t
	host := imagetest.StartRegistry(t)
	data := imagetest.NewImage(t, imagetest.ImageOptions{},
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip,
			imagetest.Dir("data"), imagetest.File("data/a.txt", "alpha\n"),
			imagetest.Dir("data/models"), imagetest.File("data/models/m.bin", "model\n")),
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip,
			imagetest.File("data/b.txt", "beta\n"), imagetest.Symlink("data/escape", "../../../../etc")))
	imagetest.Push(t, host, "data:v1", data)
	ref = host + "/data:v1"
	pulled, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("pull data image: %v", err)
	}
	return ref, pulled.ImageRef
}

// TestE2EImageVolume mounts a data image into containers (KEP-4639 image volumes):
// whole and by image_sub_path, read-only; the image is in use until the containers go,
// and nothing stays mounted after them. Bad references and sub paths are refused.
func TestE2EImageVolume(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)

	// The second layer adds a file and a symlink that leads out of the image.
	dataRef, dataID := e.pushDataImage(ctx)
	host, _, _ := strings.Cut(dataRef, "/")

	pod := e.podConfig("imgvol")
	podID := e.runPod(ctx, pod)
	volumes := filepath.Join(e.state, "imagevolumes")

	// As kubelet sends it: the image ID from PullImage, read-only.
	whole := ctrConfig("whole", img, "sleep", "1000")
	whole.Mounts = []*cri.Mount{{ContainerPath: "/data", Image: &cri.ImageSpec{Image: dataID}, Readonly: true}}
	wholeID := e.runCtr(ctx, podID, pod, whole)
	// By tag, a sub path, twice the same image (one mount of it).
	sub := ctrConfig("sub", img, "sleep", "1000")
	sub.Mounts = []*cri.Mount{
		{ContainerPath: "/models", Image: &cri.ImageSpec{Image: dataRef}, ImageSubPath: "data/models", Readonly: true},
		{ContainerPath: "/all", Image: &cri.ImageSpec{Image: dataRef}, Readonly: true},
	}
	subID := e.runCtr(ctx, podID, pod, sub)

	for _, c := range []struct {
		id   string
		cmd  []string
		want string
	}{
		{wholeID, []string{"cat", "/data/data/a.txt", "/data/data/b.txt", "/data/data/models/m.bin"}, "alpha\nbeta\nmodel\n"},
		{subID, []string{"ls", "/models"}, "m.bin\n"},
		{subID, []string{"cat", "/models/m.bin", "/all/data/a.txt"}, "model\nalpha\n"},
	} {
		resp, err := e.execSync(ctx, c.id, 10, c.cmd...)
		if err != nil || resp.ExitCode != 0 || string(resp.Stdout) != c.want {
			t.Errorf("%v: %q (stderr %q, exit %d), %v; want %q", c.cmd, resp.GetStdout(), resp.GetStderr(), resp.GetExitCode(), err, c.want)
		}
	}
	for _, c := range []struct{ id, path string }{{wholeID, "/data/new"}, {wholeID, "/data/data/a.txt"}, {subID, "/models/new"}} {
		resp, err := e.execSync(ctx, c.id, 10, "sh", "-c", "echo x > "+c.path)
		if err != nil || resp.ExitCode == 0 || !strings.Contains(string(resp.Stderr), "Read-only file system") {
			t.Errorf("write %s: exit %d stderr %q, %v; want a read-only file system", c.path, resp.GetExitCode(), resp.GetStderr(), err)
		}
	}
	if got := mountsUnder(volumes); len(got) != 2 {
		t.Errorf("mounts under %s: %v; want one per container", volumes, got)
	}

	// The status reports the mounts as asked, with the image.
	st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: subID})
	if err != nil {
		t.Fatal(err)
	}
	if ms := st.Status.GetMounts(); len(ms) != 2 || ms[0].GetImage().GetImage() != dataRef || ms[0].GetImageSubPath() != "data/models" || ms[0].GetContainerPath() != "/models" {
		t.Errorf("status mounts: %v", ms)
	}

	// In use: refused by ID and by tag while the containers mount it.
	for _, ref := range []string{dataID, dataRef} {
		_, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: ref}})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "in use") {
			t.Errorf("RemoveImage %s while mounted: %v; want FailedPrecondition", ref, err)
		}
	}

	// Refused mounts leave nothing mounted.
	for _, c := range []struct {
		name  string
		mount *cri.Mount
		code  codes.Code
	}{
		{"missing", &cri.Mount{ContainerPath: "/x", Image: &cri.ImageSpec{Image: host + "/nope:v1"}, Readonly: true}, codes.NotFound},
		{"dotdot", &cri.Mount{ContainerPath: "/x", Image: &cri.ImageSpec{Image: dataID}, ImageSubPath: "../..", Readonly: true}, codes.InvalidArgument},
		{"escape", &cri.Mount{ContainerPath: "/x", Image: &cri.ImageSpec{Image: dataID}, ImageSubPath: "data/escape", Readonly: true}, codes.InvalidArgument},
		{"absent", &cri.Mount{ContainerPath: "/x", Image: &cri.ImageSpec{Image: dataID}, ImageSubPath: "data/none", Readonly: true}, codes.InvalidArgument},
		{"file", &cri.Mount{ContainerPath: "/x", Image: &cri.ImageSpec{Image: dataID}, ImageSubPath: "data/a.txt", Readonly: true}, codes.InvalidArgument},
		{"both", &cri.Mount{ContainerPath: "/x", HostPath: e.dir, Image: &cri.ImageSpec{Image: dataID}, Readonly: true}, codes.InvalidArgument},
	} {
		cfg := ctrConfig("bad-"+c.name, img, "true")
		cfg.Mounts = []*cri.Mount{c.mount}
		_, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
		if status.Code(err) != c.code || !strings.Contains(err.Error(), "ImageVolumeMountFailed") {
			t.Errorf("%s: CreateContainer: %v; want %v naming ImageVolumeMountFailed", c.name, err, c.code)
		}
	}
	if got := mountsUnder(volumes); len(got) != 2 {
		t.Errorf("mounts under %s after refused creates: %v", volumes, got)
	}

	for _, id := range []string{wholeID, subID} {
		if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("RemoveContainer %s: %v", id, err)
		}
	}
	if got := mountsUnder(volumes); len(got) != 0 {
		t.Errorf("mounts left under %s after RemoveContainer: %v", volumes, got)
	}
	if left, _ := os.ReadDir(volumes); len(left) != 0 {
		t.Errorf("image volume dirs left: %v", left)
	}
	if _, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: dataID}}); err != nil {
		t.Fatalf("RemoveImage after the containers went: %v", err)
	}
	if st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: dataID}}); err != nil || st.GetImage() != nil {
		t.Errorf("image still there after removal: %v %v", st, err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
}

// TestE2EImageVolumeRecovery: a criserver killed with -9 finds its image volumes
// mounted and still in use after the restart; the volume of a container whose record
// never landed (a CreateContainer cut short) is unmounted and released by recovery.
func TestE2EImageVolumeRecovery(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	dataRef, dataID := e.pushDataImage(ctx)
	pod := e.podConfig("imgvol-rec")
	podID := e.runPod(ctx, pod)
	volumes := filepath.Join(e.state, "imagevolumes")
	ids := map[string]string{}
	for _, name := range []string{"kept", "cut"} {
		cfg := ctrConfig(name, img, "sleep", "1000")
		cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", Image: &cri.ImageSpec{Image: dataID}, Readonly: true}}
		ids[name] = e.runCtr(ctx, podID, pod, cfg)
	}

	e.kill9()
	// "cut" loses its record, as if criserver died before writing it.
	st, err := store.Open(filepath.Join(e.root, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Delete("containers", ids["cut"]); err != nil {
		t.Fatal(err)
	}
	st.Close()
	e.start()
	ctx = ctxT(t)

	if got := mountsUnder(volumes); len(got) != 1 || !strings.HasPrefix(got[0], filepath.Join(volumes, ids["kept"])+"/") {
		t.Errorf("mounts under %s after the restart: %v; want only the one of %s", volumes, got, ids["kept"])
	}
	if _, err := os.Stat(filepath.Join(volumes, ids["cut"])); !os.IsNotExist(err) {
		t.Errorf("image volume dir of the container with no record: %v", err)
	}
	resp, err := e.execSync(ctx, ids["kept"], 10, "cat", "/data/data/a.txt")
	if err != nil || string(resp.GetStdout()) != "alpha\n" {
		t.Errorf("volume after the restart: %q, %v", resp.GetStdout(), err)
	}
	if _, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: dataRef}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("RemoveImage after the restart while mounted: %v; want FailedPrecondition", err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	if got := mountsUnder(volumes); len(got) != 0 {
		t.Errorf("mounts left under %s after RemovePodSandbox: %v", volumes, got)
	}
	if _, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: dataRef}}); err != nil {
		t.Errorf("RemoveImage after the pod went: %v", err)
	}
}
