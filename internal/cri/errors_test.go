package cri

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image"
	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// TestToStatusKinds: every errdefs kind the services return becomes its gRPC code,
// however deep it is wrapped, with the message kept.
func TestToStatusKinds(t *testing.T) {
	for _, tc := range []struct {
		kind error
		want codes.Code
	}{
		{errdefs.ErrInvalidArgument, codes.InvalidArgument},
		{errdefs.ErrNotFound, codes.NotFound},
		{errdefs.ErrAlreadyExists, codes.AlreadyExists},
		{errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
		{errdefs.ErrConflict, codes.FailedPrecondition},
		{errdefs.ErrUnavailable, codes.Unavailable},
		{errdefs.ErrNotImplemented, codes.Unimplemented},
		{errdefs.ErrUnauthenticated, codes.Unauthenticated},
		{errdefs.ErrPermissionDenied, codes.PermissionDenied},
		{errdefs.ErrDataLoss, codes.DataLoss},
		{errdefs.ErrResourceExhausted, codes.ResourceExhausted},
		{errdefs.ErrOutOfRange, codes.OutOfRange},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{errors.New("plain"), codes.Unknown},
	} {
		err := fmt.Errorf("pull image %q: %w", "x", fmt.Errorf("layer: %w", errors.Join(errors.New("detail"), tc.kind)))
		got := toStatus(err)
		if status.Code(got) != tc.want || !strings.Contains(got.Error(), "detail") {
			t.Errorf("toStatus(%v) = %v, want %s keeping the message", err, got, tc.want)
		}
	}
}

// TestPullImageErrorCodes pulls through PullImage with the real image service and
// checks the code kubelet and crictl see: a bad image is InvalidArgument, refused
// credentials Unauthenticated or PermissionDenied, a network fault Unavailable.
func TestPullImageErrorCodes(t *testing.T) {
	testutil.RequiresRoot(t, "unpacks layers")
	root := t.TempDir()
	db, err := store.Open(filepath.Join(root, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	log := slog.New(slog.DiscardHandler)
	images, err := image.New(image.Config{Root: filepath.Join(root, "images")}, db, log)
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{images: images, log: log}

	rawTar := func(hdrs ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			tw.Write(make([]byte, h.Size))
		}
		tw.Close()
		return buf.Bytes()
	}
	withLayer := func(tarball []byte) *imagetest.Layer {
		return imagetest.LayerFromTar(t, imagetest.OCI, imagetest.Gzip, tarball)
	}
	valid := rawTar(&tar.Header{Name: "a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3000})

	host := imagetest.StartRegistry(t)
	push := func(ref string, layer *imagetest.Layer) string {
		imagetest.Push(t, host, ref, imagetest.NewImage(t, imagetest.ImageOptions{}, layer))
		return host + "/" + ref
	}
	bigConfig := imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{Labels: map[string]string{"junk": strings.Repeat("y", 9<<20)}}}, withLayer(valid))
	imagetest.Push(t, host, "bad/config:1", bigConfig)
	basic := imagetest.StartRegistry(t, imagetest.WithBasicAuth("kube", "pw"))
	good := withLayer(valid)
	imagetest.Push(t, basic, "private:1", imagetest.NewImage(t, imagetest.ImageOptions{}, good), ggcrremote.WithAuth(&authn.Basic{Username: "kube", Password: "pw"}))
	forbidden := imagetest.StartRegistry(t, imagetest.WithErrorStatus(http.StatusForbidden, func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/")
	}))
	dying := imagetest.StartRegistry(t, imagetest.WithDyingBlobs(imagetest.Blobs(imagetest.Digest(t, good)), 10))
	imagetest.Push(t, dying, "app:1", imagetest.NewImage(t, imagetest.ImageOptions{}, good))

	for _, tc := range []struct {
		name string
		ref  string
		auth *runtime.AuthConfig
		want codes.Code
		say  string
	}{
		{"hard link to a missing target", push("bad/link:1", withLayer(rawTar(&tar.Header{Name: "pw", Typeflag: tar.TypeLink, Linkname: "nope"}))),
			nil, codes.InvalidArgument, `refused entry "pw"`},
		{"whiteout of dot", push("bad/wh:1", withLayer(rawTar(&tar.Header{Name: "d/.wh..", Typeflag: tar.TypeReg, Mode: 0o644}))),
			nil, codes.InvalidArgument, `refused entry "d/.wh.."`},
		{"truncated tar", push("bad/short:1", withLayer(valid[:1500])), nil, codes.InvalidArgument, "truncated"},
		{"corrupt gzip", push("bad/gzip:1", good.WithBlob(good.Blob()[:len(good.Blob())/2])), nil, codes.InvalidArgument, "gzip"},
		{"config over the size limit", host + "/bad/config:1", nil, codes.InvalidArgument, "image config " + imagetest.ConfigDigest(t, bigConfig).String()},
		{"no credentials", basic + "/private:1", nil, codes.Unauthenticated, "requires credentials"},
		{"wrong password", basic + "/private:1", &runtime.AuthConfig{Username: "kube", Password: "wrong-pw"}, codes.Unauthenticated, "rejected the credentials"},
		{"forbidden", forbidden + "/private:1", &runtime.AuthConfig{Username: "kube", Password: "wrong-pw"}, codes.PermissionDenied, "403 Forbidden"},
		{"registry dies mid-blob", dying + "/app:1", nil, codes.Unavailable, "lost after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.PullImage(context.Background(), &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: tc.ref}, Auth: tc.auth})
			t.Log(err)
			st, ok := status.FromError(err)
			if !ok || st.Code() != tc.want || !strings.Contains(st.Message(), tc.ref) || !strings.Contains(st.Message(), tc.say) {
				t.Errorf("PullImage = %v, want %s naming %s and saying %q", err, tc.want, tc.ref, tc.say)
			}
			if strings.Contains(st.Message(), "wrong-pw") {
				t.Errorf("the error echoes the password: %v", err)
			}
		})
	}
}
