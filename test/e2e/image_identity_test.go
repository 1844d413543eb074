package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// TestE2EImageIdentity pulls one busybox image by tag, by digest, by a second tag, under
// a second repository and through a registry mirror. Every PullImage returns the config
// digest and every ImageStatus reports it as the id; containers created from each
// reference (as kubelet does: the pulled image ref in image, the pod spec's name in
// user_specified_image; and as crictl does: the name only) report that id as image_id
// and the repo digest of the repository they name as image_ref.
func TestE2EImageIdentity(t *testing.T) {
	e := newEnv(t)
	host := imagetest.StartRegistry(t)
	// A registry name that does not resolve, reachable only through its mirror: the
	// image must come from the mirror and still be named after the registry.
	const mirrored = "registry.crisp.invalid"
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg = append(cfg, []byte("[registry.mirrors]\n\""+mirrored+"\" = [\"http://"+host+"\"]\n")...)
	if err := os.WriteFile(e.cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	ctx := ctxT(t)

	img := imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip)
	imagetest.Push(t, host, "id/busybox:1.0", img)
	imagetest.Push(t, host, "id/busybox:stable", img)
	imagetest.Push(t, host, "copy/busybox:1.0", img)
	id := imagetest.ConfigDigest(t, img).String()
	mdig := imagetest.Digest(t, img).String()
	repo, copyRepo := host+"/id/busybox", host+"/copy/busybox"

	// reference -> the image_ref a container created from it must report.
	refs := []struct{ ref, wantRef string }{
		{repo + ":1.0", repo + "@" + mdig},
		{repo + "@" + mdig, repo + "@" + mdig},
		{repo + ":stable", repo + "@" + mdig},
		{copyRepo + ":1.0", copyRepo + "@" + mdig},
		{mirrored + "/id/busybox:1.0", mirrored + "/id/busybox@" + mdig},
	}
	for _, r := range refs {
		resp, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: r.ref}})
		if err != nil {
			t.Fatalf("pull %s: %v", r.ref, err)
		}
		if resp.ImageRef != id {
			t.Errorf("PullImage %s: image_ref %s, want the image id %s", r.ref, resp.ImageRef, id)
		}
	}
	for _, r := range refs {
		st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: r.ref}})
		if err != nil || st.GetImage().GetId() != id {
			t.Errorf("ImageStatus %s: %v %v, want id %s", r.ref, st.GetImage(), err, id)
		}
	}
	list, err := e.img.ListImages(ctx, &cri.ListImagesRequest{})
	if err != nil || len(list.Images) != 1 {
		t.Fatalf("ListImages: %v %v, want one image", list, err)
	}
	if got := list.Images[0]; len(got.RepoTags) != 4 || len(got.RepoDigests) != 3 {
		t.Errorf("one image five ways: tags %v digests %v", got.RepoTags, got.RepoDigests)
	}

	pod := e.podConfig("ident")
	podID := e.runPod(ctx, pod)
	check := func(name string, spec *cri.ImageSpec, wantRef string) {
		t.Helper()
		cfg := ctrConfig(name, "", "true")
		cfg.Image = spec
		resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
		if err != nil {
			t.Fatalf("CreateContainer %s: %v", name, err)
		}
		st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: resp.ContainerId})
		if err != nil {
			t.Fatal(err)
		}
		s := st.Status
		if s.ImageId != id || s.ImageRef != wantRef {
			t.Errorf("%s: image_id %s image_ref %s, want %s and %s", name, s.ImageId, s.ImageRef, id, wantRef)
		}
		wantUser := spec.UserSpecifiedImage
		if wantUser == "" {
			wantUser = spec.Image
		}
		// The image is shown by a tag, the one created with when it is one.
		wantTag := list.Images[0].RepoTags[0]
		if slices.Contains(list.Images[0].RepoTags, wantUser) {
			wantTag = wantUser
		}
		if s.Image.GetImage() != wantTag {
			t.Errorf("%s: image %q, want the tag %q (of %v)", name, s.Image.GetImage(), wantTag, list.Images[0].RepoTags)
		}
		if s.Image.GetUserSpecifiedImage() != wantUser {
			t.Errorf("%s: user_specified_image %q, want %q", name, s.Image.GetUserSpecifiedImage(), wantUser)
		}
		ls, err := e.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{Id: resp.ContainerId}})
		if err != nil || len(ls.Containers) != 1 || ls.Containers[0].ImageId != id || ls.Containers[0].ImageRef != wantRef {
			t.Errorf("%s: ListContainers %v %v", name, ls.GetContainers(), err)
		}
	}
	for i, r := range refs {
		check("kubelet-"+string(rune('a'+i)), &cri.ImageSpec{Image: id, UserSpecifiedImage: r.ref}, r.wantRef)
		check("crictl-"+string(rune('a'+i)), &cri.ImageSpec{Image: r.ref}, r.wantRef)
	}
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}

// TestE2EPullDeadline pulls through criserver while the registry stalls the layer: a
// PullImage with a short deadline fails with DeadlineExceeded right after it, criserver
// abandons the download (the registry sees the request go away), leaves no image,
// blob or ingest file, and a later pull of the same image succeeds.
func TestE2EPullDeadline(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)

	layer := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("big", 8<<20, 11))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layer)
	layerDigest := imagetest.Digest(t, layer)
	stall := imagetest.NewStaller()
	var inFlight atomic.Int32 // blob GETs the registry is serving right now
	host := imagetest.StartRegistry(t,
		imagetest.WithMiddleware(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
					inFlight.Add(1)
					defer inFlight.Add(-1)
				}
				next.ServeHTTP(w, r)
			})
		}),
		imagetest.WithStalledBlobs(imagetest.Blobs(layerDigest), 1<<20, stall))
	imagetest.Push(t, host, "slow/app:v1", img)
	ref := host + "/slow/app:v1"

	const deadline = time.Second
	pctx, cancel := context.WithTimeout(ctx, deadline)
	start := time.Now()
	_, err := e.img.PullImage(pctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
	took := time.Since(start)
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("PullImage past its deadline: %v, want DeadlineExceeded", err)
	}
	select {
	case <-stall.Stalled():
	default:
		t.Fatal("the layer download never reached the registry: the deadline was not hit mid-download")
	}
	if took > deadline+500*time.Millisecond {
		t.Errorf("PullImage returned %v after a %v deadline", took, deadline)
	}
	// The client's own timer ends the RPC; criserver must also let go of the download.
	var released time.Duration
	for released = time.Since(start); inFlight.Load() != 0 && released < deadline+5*time.Second; released = time.Since(start) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := inFlight.Load(); n != 0 {
		t.Fatalf("%d blob downloads still open %v after the deadline", n, released-deadline)
	}
	t.Logf("PullImage with a %v deadline failed after %v; criserver closed the download %v after the deadline", deadline, took, released-deadline)
	// The call's log line follows the answer; the download may be let go before it.
	answered := false
	for end := time.Now().Add(5 * time.Second); !answered && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		answered = strings.Contains(e.log(), "code = DeadlineExceeded")
	}
	if !answered {
		t.Errorf("criserver did not answer the pull with DeadlineExceeded")
	}

	if st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil || st.Image != nil {
		t.Errorf("ImageStatus after the failed pull: %v %v", st.GetImage(), err)
	}
	content := filepath.Join(e.root, "images", "content")
	if _, err := os.Stat(filepath.Join(content, "blobs", "sha256", layerDigest.Encoded())); !os.IsNotExist(err) {
		t.Errorf("the half-downloaded layer is in the content store (%v)", err)
	}
	// The ingest file is removed when the download ends, which may be a moment after
	// the registry saw the connection close.
	var left []os.DirEntry
	for end := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if left, err = os.ReadDir(filepath.Join(content, "ingest")); err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 || time.Now().After(end) {
			break
		}
	}
	for _, f := range left {
		t.Errorf("ingest file left behind: %s", f.Name())
	}

	stall.Release()
	resp, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("pull after the registry recovered: %v", err)
	}
	if resp.ImageRef != imagetest.ConfigDigest(t, img).String() {
		t.Errorf("pulled %s", resp.ImageRef)
	}
	if _, err := os.Stat(filepath.Join(content, "blobs", "sha256", layerDigest.Encoded())); err != nil {
		t.Errorf("layer after the second pull: %v", err)
	}
}
