package cri

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
	crierrors "k8s.io/cri-api/pkg/errors"

	"github.com/crisp-runtime/crisp/internal/mount"
)

// Image volumes (KEP-4639): a CRI mount naming an image gets that image's layers
// mounted read-only at state_dir/imagevolumes/<container id>/<n> (one mount per image
// per container, an overlay of lower dirs only, nothing written), which the spec then
// binds like a host path. Each mount is recorded as an image view (image.Service.View)
// keyed <container id>/<n>, so RemoveImage refuses the image and its layers stay
// until the container is removed.

// imageVolumesRoot holds the image volume mounts of every container.
func (s *Service) imageVolumesRoot() string { return filepath.Join(s.cfg.StateDir, "imagevolumes") }

// imageVolumesDir holds the image volume mounts of container id.
func (s *Service) imageVolumesDir(id string) string { return filepath.Join(s.imageVolumesRoot(), id) }

// imageViewKey names the n-th image a container mounts in the image store.
func imageViewKey(id string, n int) string { return id + "/" + strconv.Itoa(n) }

// isImageMount tells whether m names an image, or an image sub path (refused without
// an image rather than ignored). An empty ImageSpec on a host path mount is not one.
func isImageMount(m *runtime.Mount) bool {
	return m.GetImage().GetImage() != "" || m.GetImageSubPath() != ""
}

// hasImageVolumes tells whether any mount of cfg is an image mount.
func hasImageVolumes(cfg *runtime.ContainerConfig) bool {
	return slices.ContainsFunc(cfg.GetMounts(), isImageMount)
}

// mountImageVolumes mounts the image of every mount of cfg that names one and returns
// the config the spec is built from: a copy whose image mounts are read-only binds of
// those directories (or of their image_sub_path). cfg itself is not modified: the
// record keeps the mounts as asked, which ContainerStatus reports. Without image
// mounts cfg is returned as is. On failure nothing stays mounted.
func (s *Service) mountImageVolumes(id string, cfg *runtime.ContainerConfig, mountLabel string) (_ *runtime.ContainerConfig, retErr error) {
	if !hasImageVolumes(cfg) {
		return cfg, nil
	}
	defer func() {
		if retErr != nil {
			if err := s.unmountImageVolumes(id); err != nil {
				s.log.Warn("unmount image volumes after failed create", "container", id, "err", err)
			}
			// kubelet reports this reason; containerd wraps its image mount errors so too.
			retErr = fmt.Errorf("%w: %w", crierrors.ErrImageVolumeMountFailed, retErr)
		}
	}()
	out := proto.Clone(cfg).(*runtime.ContainerConfig)
	roots := map[string]string{} // image ID -> where it is mounted
	for _, m := range out.GetMounts() {
		if !isImageMount(m) {
			continue
		}
		root, err := s.imageVolumeRoot(id, m, roots, mountLabel)
		if err != nil {
			return nil, err
		}
		src, err := resolveImageSubPath(root, m.GetImageSubPath())
		if err != nil {
			return nil, fmt.Errorf("mount at %s: image %q: %w", m.GetContainerPath(), m.GetImage().GetImage(), err)
		}
		// All image mounts are read-only by the KEP's definition; the overlay has no
		// upper dir anyway, so a writable bind could not write either.
		m.HostPath, m.Image, m.ImageSubPath, m.Readonly = src, nil, "", true
	}
	return out, nil
}

// imageVolumeRoot validates image mount m and returns where its image is mounted for
// container id, mounting it when this is the first mount of that image (roots), with
// the container's SELinux mount label.
func (s *Service) imageVolumeRoot(id string, m *runtime.Mount, roots map[string]string, mountLabel string) (string, error) {
	ref := m.GetImage().GetImage()
	switch {
	case ref == "":
		return "", invalid("mount at %s: image_sub_path %q without an image", m.GetContainerPath(), m.GetImageSubPath())
	case m.GetHostPath() != "":
		return "", invalid("mount at %s names both host_path %q and image %q: they exclude each other", m.GetContainerPath(), m.GetHostPath(), ref)
	}
	img, err := s.images.Get(ref)
	if errdefs.IsNotFound(err) {
		return "", fmt.Errorf("mount at %s: image %q is not present: pull it first: %w", m.GetContainerPath(), ref, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("mount at %s: image %q: %w", m.GetContainerPath(), ref, err)
	}
	if root, ok := roots[img.ID]; ok {
		return root, nil
	}
	n := len(roots)
	root := filepath.Join(s.imageVolumesDir(id), strconv.Itoa(n))
	// The record first: unmountImageVolumes (and recovery) find it even if the mount
	// below is cut short, and the image cannot go while it is being mounted.
	ms, err := s.images.View(imageViewKey(id, n), img)
	if err != nil {
		return "", fmt.Errorf("mount at %s: image %q: %w", m.GetContainerPath(), ref, err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("mount at %s: image %q: %w", m.GetContainerPath(), ref, err)
	}
	mounts := make([]mount.Mount, 0, len(ms))
	for _, sm := range ms {
		mounts = append(mounts, mount.Mount{Type: sm.Type, Source: sm.Source, Options: sm.Options})
	}
	if err := mount.All(withMountLabel(mounts, mountLabel), root); err != nil {
		return "", fmt.Errorf("mount at %s: image %q: %w", m.GetContainerPath(), ref, err)
	}
	roots[img.ID] = root
	return root, nil
}

// unmountImageVolumes unmounts and removes the image volumes of container id and then
// drops their image views, so the images may be removed again. The views stay when an
// unmount fails: the layers must outlive the mount. Nothing to do is not an error.
func (s *Service) unmountImageVolumes(id string) error {
	dir := s.imageVolumesDir(id)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image volumes of container %s: %w", id, err)
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if err := mount.Unmount(p); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("unmount image volumes of container %s: %w", id, err)
	}
	keys, err := s.images.ViewKeys()
	if err != nil {
		return err
	}
	for _, k := range keys {
		if owner, _, _ := strings.Cut(k, "/"); owner == id {
			if err := s.images.RemoveView(k); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// imageVolumeOwners lists the containers that have image volume mounts or views,
// for recovery to remove those no record owns.
func (s *Service) imageVolumeOwners() ([]string, error) {
	seen := map[string]bool{}
	var out []string
	add := func(id string) {
		if id != "" && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	entries, err := os.ReadDir(s.imageVolumesRoot())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list image volumes: %w", err)
	}
	for _, e := range entries {
		add(e.Name())
	}
	keys, err := s.images.ViewKeys()
	if err != nil {
		return out, err
	}
	for _, k := range keys {
		owner, _, _ := strings.Cut(k, "/")
		add(owner)
	}
	return out, nil
}

// resolveImageSubPath returns the directory sub names inside the mounted image root,
// with its symlinks resolved inside the image, or root for an empty sub. A path that
// is absolute, climbs out with "..", or meets a symlink leading out of the image (an
// absolute one included, as os.Root refuses it) is InvalidArgument, as is one that
// does not exist or is not a directory (the KEP mounts directories only).
func resolveImageSubPath(root, sub string) (string, error) {
	if sub == "" {
		return root, nil
	}
	if !filepath.IsLocal(sub) {
		return "", invalid("image_sub_path %q must be a relative path inside the image, without \"..\" leading out of it", sub)
	}
	f, err := os.OpenInRoot(root, sub)
	if errors.Is(err, fs.ErrNotExist) {
		return "", invalid("image_sub_path %q does not exist in the image", sub)
	}
	if err != nil {
		// os.Root refuses symlinks that lead out of the root ("path escapes from parent").
		return "", invalid("image_sub_path %q cannot be resolved inside the image: %v", sub, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("image_sub_path %q: %w", sub, err)
	}
	if !fi.IsDir() {
		return "", invalid("image_sub_path %q is not a directory in the image: only directories can be mounted", sub)
	}
	// The path the open resolved to, symlinks and all: the bind follows no link later.
	real, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return "", fmt.Errorf("image_sub_path %q: resolve: %w", sub, err)
	}
	rootReal, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", fmt.Errorf("image_sub_path %q: resolve root: %w", sub, err)
	}
	if real != rootReal && !strings.HasPrefix(real, rootReal+"/") {
		return "", invalid("image_sub_path %q resolves to %s, outside the image", sub, real)
	}
	return real, nil
}
