package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image"
	"github.com/crisp-runtime/crisp/internal/image/remote"
)

// PullImage pulls an image and returns its ID, which is also what ImageStatus and
// ContainerStatus report as the image's identity.
func (s *Service) PullImage(ctx context.Context, req *runtime.PullImageRequest) (*runtime.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, toStatus(invalid("image reference is required"))
	}
	var auth *remote.Auth
	if a := req.GetAuth(); a != nil {
		auth = &remote.Auth{
			Username:      a.GetUsername(),
			Password:      a.GetPassword(),
			Auth:          a.GetAuth(),
			ServerAddress: a.GetServerAddress(),
			IdentityToken: a.GetIdentityToken(),
			RegistryToken: a.GetRegistryToken(),
		}
	}
	start := time.Now()
	img, err := s.images.Pull(ctx, ref, auth)
	if err != nil {
		return nil, toStatus(s.pullError(ctx, ref, start, err))
	}
	return &runtime.PullImageResponse{ImageRef: img.ID}, nil
}

// deadlineSlack is how close to its deadline a cancelled call counts as having run
// out of time: the client's deadline timer fires a moment before the server's, so
// the server usually learns of an expired deadline as a cancellation (RST_STREAM).
const deadlineSlack = 100 * time.Millisecond

// pullError describes a failed pull. A pull the caller gave up on is reported as
// DeadlineExceeded or Canceled, saying the download was abandoned (the image store
// keeps nothing of it, so a retry starts clean); the detail goes to the log.
func (s *Service) pullError(ctx context.Context, ref string, start time.Time, err error) error {
	if ctx.Err() == nil {
		return fmt.Errorf("pull image %q: %w", ref, err)
	}
	took := time.Since(start).Round(time.Millisecond)
	kind, why := context.Canceled, "the caller cancelled it"
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < deadlineSlack {
		kind, why = context.DeadlineExceeded, "the caller's deadline passed"
	}
	s.log.Info("pull abandoned", "ref", ref, "after", took, "reason", why, "err", err)
	return fmt.Errorf("pull image %q: %s after %v; the download was stopped and nothing of it kept, retry with a longer deadline: %w", ref, why, took, kind)
}

// ListImages lists images, or only the one the filter names.
func (s *Service) ListImages(_ context.Context, req *runtime.ListImagesRequest) (*runtime.ListImagesResponse, error) {
	imgs, err := s.listImages(req.GetFilter())
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ListImagesResponse{Images: imgs}, nil
}

// listImages is the one filter ListImages and StreamImages share.
func (s *Service) listImages(f *runtime.ImageFilter) ([]*runtime.Image, error) {
	var imgs []*image.Image
	if ref := f.GetImage().GetImage(); ref != "" {
		img, err := s.images.Get(ref)
		if err != nil && !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("look up image %q: %w", ref, err)
		}
		if img != nil {
			imgs = append(imgs, img)
		}
	} else {
		imgs = s.images.List()
	}
	out := make([]*runtime.Image, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, s.criImage(img))
	}
	return out, nil
}

// ImageStatus describes one image; an unknown image is an empty answer, not an error,
// as the CRI requires.
func (s *Service) ImageStatus(_ context.Context, req *runtime.ImageStatusRequest) (*runtime.ImageStatusResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, toStatus(invalid("image reference is required"))
	}
	img, err := s.images.Get(ref)
	if errdefs.IsNotFound(err) {
		return &runtime.ImageStatusResponse{}, nil
	}
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &runtime.ImageStatusResponse{Image: s.criImage(img)}
	if req.GetVerbose() {
		info := map[string]any{
			"imageSpec":      json.RawMessage(img.Config),
			"chainIDs":       img.ChainIDs,
			"manifestDigest": img.ManifestDigest,
			"layers":         img.Layers,
			"pulled":         img.Pulled.Format(time.RFC3339Nano),
		}
		if img.IndexDigest != "" {
			info["indexDigest"] = img.IndexDigest
		}
		data, err := json.Marshal(info)
		if err != nil {
			return nil, toStatus(fmt.Errorf("encode image info: %w", err))
		}
		resp.Info = map[string]string{"info": string(data)}
	}
	return resp, nil
}

// RemoveImage removes an image by ID, tag or digest; unknown images succeed.
func (s *Service) RemoveImage(ctx context.Context, req *runtime.RemoveImageRequest) (*runtime.RemoveImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, toStatus(invalid("image reference is required"))
	}
	if err := s.images.Remove(ctx, ref); err != nil {
		return nil, toStatus(fmt.Errorf("remove image %q: %w", ref, err))
	}
	return &runtime.RemoveImageResponse{}, nil
}

// ImageFsInfo reports the space and inodes the image store uses.
func (s *Service) ImageFsInfo(context.Context, *runtime.ImageFsInfoRequest) (*runtime.ImageFsInfoResponse, error) {
	mp, bytes, inodes, err := s.images.FsInfo()
	if err != nil {
		return nil, toStatus(fmt.Errorf("image filesystem usage: %w", err))
	}
	return &runtime.ImageFsInfoResponse{ImageFilesystems: []*runtime.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtime.FilesystemIdentifier{Mountpoint: mp},
		UsedBytes:  &runtime.UInt64Value{Value: uint64(bytes)},
		InodesUsed: &runtime.UInt64Value{Value: uint64(inodes)},
	}}}, nil
}

func (s *Service) criImage(img *image.Image) *runtime.Image {
	out := &runtime.Image{
		Id:          img.ID,
		RepoTags:    img.RepoTags,
		RepoDigests: img.RepoDigests,
		Size:        uint64(img.Size),
		Spec:        &runtime.ImageSpec{Image: img.ID},
		Pinned:      s.images.Pinned(img),
	}
	if spec, err := img.Spec(); err == nil {
		uid, name := imageUser(spec.Config.User)
		if uid != nil {
			out.Uid = &runtime.Int64Value{Value: *uid}
		}
		out.Username = name
	}
	return out
}

// imageUser splits an image's USER ("1000", "1000:50", "app", "app:grp") into the uid
// or the user name kubelet expects (kubelet checks runAsNonRoot against it).
func imageUser(user string) (*int64, string) {
	u, _, _ := strings.Cut(user, ":")
	if u == "" {
		return nil, ""
	}
	if n, err := strconv.ParseInt(u, 10, 64); err == nil {
		return &n, ""
	}
	return nil, u
}
