package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

func TestE2EImages(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	host := imagetest.StartRegistry(t, imagetest.WithBasicAuth("kube", "pw"))
	img := imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{User: "nobody", Cmd: []string{"/bin/sh"}}},
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.BusyboxEntries(t)...))
	imagetest.Push(t, host, "tools/busybox:1.36", img, pushAuth("kube", "pw"))
	imagetest.Push(t, host, "tools/busybox:latest", img, pushAuth("kube", "pw"))
	other := imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{User: "1000:1000"}},
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Zstd, imagetest.File("hello", "world")))
	imagetest.Push(t, host, "tools/other:v1", other, pushAuth("kube", "pw"))
	id := imagetest.ConfigDigest(t, img).String()

	// Without credentials: a clear Unauthenticated error.
	_, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: host + "/tools/busybox:1.36"}})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("pull without credentials: %v", err)
	}
	// Wrong credentials: Unauthenticated as well, saying so, and never echoing them.
	_, err = e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: host + "/tools/busybox:1.36"},
		Auth: &cri.AuthConfig{Username: "kube", Password: "not-the-pw", ServerAddress: host}})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "rejected the credentials") || strings.Contains(err.Error(), "not-the-pw") {
		t.Fatalf("pull with wrong credentials: %v, want Unauthenticated saying the credentials were rejected", err)
	}
	auth := &cri.AuthConfig{Username: "kube", Password: "pw", ServerAddress: host}
	// A layer the unpack refuses is the image's fault: InvalidArgument naming the layer.
	evil := imagetest.NewImage(t, imagetest.ImageOptions{}, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.Hardlink("pw", "missing")))
	imagetest.Push(t, host, "tools/evil:v1", evil, pushAuth("kube", "pw"))
	_, err = e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: host + "/tools/evil:v1"}, Auth: auth})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), imagetest.LayerDigests(t, evil)[0].String()) {
		t.Fatalf("pull of an image with a bad layer: %v, want InvalidArgument naming the layer", err)
	}
	for _, ref := range []string{host + "/tools/busybox:1.36", host + "/tools/busybox:latest", host + "/tools/other:v1"} {
		resp, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}, Auth: auth})
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if strings.Contains(ref, "busybox") && resp.ImageRef != id {
			t.Errorf("pull %s: image ref %s, want the image id %s", ref, resp.ImageRef, id)
		}
	}
	list, err := e.img.ListImages(ctx, &cri.ListImagesRequest{})
	if err != nil || len(list.Images) != 2 {
		t.Fatalf("ListImages: %v %v", list, err)
	}
	filtered, err := e.img.ListImages(ctx, &cri.ListImagesRequest{Filter: &cri.ImageFilter{Image: &cri.ImageSpec{Image: host + "/tools/other:v1"}}})
	if err != nil || len(filtered.Images) != 1 || filtered.Images[0].RepoTags[0] != host+"/tools/other:v1" {
		t.Fatalf("ListImages filter: %v %v", filtered, err)
	}
	st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: host + "/tools/busybox:latest"}, Verbose: true})
	if err != nil || st.Image == nil {
		t.Fatalf("ImageStatus: %v %v", st, err)
	}
	if st.Image.Id != id || len(st.Image.RepoTags) != 2 || len(st.Image.RepoDigests) != 1 || st.Image.Username != "nobody" || st.Image.Size == 0 {
		t.Errorf("ImageStatus: %+v", st.Image)
	}
	var info map[string]json.RawMessage
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || len(info["imageSpec"]) == 0 {
		t.Errorf("verbose info: %v %q", err, st.Info["info"])
	}
	st2, _ := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: host + "/tools/other:v1"}})
	if st2.GetImage().GetUid().GetValue() != 1000 {
		t.Errorf("uid of other: %v", st2.GetImage())
	}
	// Unknown image: an empty answer, not an error.
	if st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: "docker.io/library/nope:1"}}); err != nil || st.Image != nil {
		t.Errorf("unknown image status: %v %v", st, err)
	}
	if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: "UPPER/Case"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad reference: %v", err)
	}
	fs, err := e.img.ImageFsInfo(ctx, &cri.ImageFsInfoRequest{})
	if err != nil || len(fs.ImageFilesystems) != 1 || fs.ImageFilesystems[0].UsedBytes.Value < 1<<20 || fs.ImageFilesystems[0].InodesUsed.Value == 0 || fs.ImageFilesystems[0].FsId.Mountpoint == "" {
		t.Errorf("ImageFsInfo: %v %v", fs, err)
	}

	// A restart lists the same images.
	e.kill9()
	e.start()
	list, err = e.img.ListImages(ctx, &cri.ListImagesRequest{})
	if err != nil || len(list.Images) != 2 {
		t.Fatalf("after restart: %v %v", list, err)
	}
	// One tag of two: the image stays; by id: gone, with its files.
	if _, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: host + "/tools/busybox:1.36"}}); err != nil {
		t.Fatal(err)
	}
	st, _ = e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: id}})
	if st.GetImage() == nil || len(st.Image.RepoTags) != 1 {
		t.Fatalf("after removing one tag: %v", st)
	}
	for _, ref := range []string{id, host + "/tools/other:v1", id} {
		if _, err := e.img.RemoveImage(ctx, &cri.RemoveImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("remove %s: %v", ref, err)
		}
	}
	list, _ = e.img.ListImages(ctx, &cri.ListImagesRequest{})
	if len(list.GetImages()) != 0 {
		t.Fatalf("images left: %v", list.Images)
	}
	fs, _ = e.img.ImageFsInfo(ctx, &cri.ImageFsInfoRequest{})
	if used := fs.GetImageFilesystems()[0].GetUsedBytes().GetValue(); used > 64<<10 {
		t.Errorf("image filesystem still uses %d bytes with no images", used)
	}
}
