package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/continuity/fs"
	securejoin "github.com/cyphar/filepath-securejoin"

	"github.com/crisp-runtime/crisp/internal/image/snapshot"
	"github.com/crisp-runtime/crisp/internal/mount"
)

// RootfsDiff writes what a container changed in its writable snapshot key as an OCI
// layer tar to w (added and modified files, deletions as whiteouts), and returns the
// paths it deleted. It reads the overlay upper dir directly, as containerd's overlay
// differ does, so it costs a walk of the changes and not of the whole image; the lower
// layers are only looked up to tell a modification from an addition.
func (s *Service) RootfsDiff(ctx context.Context, key string, w io.Writer) (deleted []string, retErr error) {
	ms, err := s.snaps.Mounts(key)
	if err != nil {
		return nil, err
	}
	upper, lowers, err := overlayDirs(ms)
	if err != nil {
		return nil, fmt.Errorf("diff of snapshot %s: %w", key, err)
	}
	base, cleanup, err := s.lowerView(lowers)
	if err != nil {
		return nil, fmt.Errorf("diff of snapshot %s: %w", key, err)
	}
	defer cleanup()
	cw := archive.NewChangeWriter(w, upper)
	err = fs.DiffDirChanges(ctx, base, upper, fs.DiffSourceOverlayFS, func(k fs.ChangeKind, p string, fi os.FileInfo, err error) error {
		if err == nil && k == fs.ChangeKindDelete {
			deleted = append(deleted, p)
		}
		return cw.HandleChange(k, p, fi, err)
	})
	if err != nil {
		return nil, fmt.Errorf("diff of snapshot %s: %w", key, err)
	}
	if err := cw.Close(); err != nil {
		return nil, fmt.Errorf("diff of snapshot %s: %w", key, err)
	}
	return deleted, nil
}

// overlayDirs returns the upper dir and the lower dirs (topmost first) of a snapshot's
// mounts; a bind mount (an image without layers) is an upper dir over nothing.
func overlayDirs(ms []snapshot.Mount) (upper string, lowers []string, err error) {
	if len(ms) != 1 {
		return "", nil, fmt.Errorf("want one mount, got %d", len(ms))
	}
	m := ms[0]
	if m.Type == "bind" {
		return m.Source, nil, nil
	}
	for _, o := range m.Options {
		switch {
		case strings.HasPrefix(o, "upperdir="):
			upper = strings.TrimPrefix(o, "upperdir=")
		case strings.HasPrefix(o, "lowerdir="):
			lowers = strings.Split(strings.TrimPrefix(o, "lowerdir="), ":")
		}
	}
	if upper == "" {
		return "", nil, errors.New("overlay mount without upperdir")
	}
	return upper, lowers, nil
}

// lowerView returns a directory showing the merged lower layers: the layer itself for
// one, a read-only overlay of them for several, an empty directory for none.
func (s *Service) lowerView(lowers []string) (string, func(), error) {
	switch len(lowers) {
	case 1:
		return lowers[0], func() {}, nil
	}
	dir, err := os.MkdirTemp(s.cfg.Root, "tmp-lower-")
	if err != nil {
		return "", nil, fmt.Errorf("lower view: %w", err)
	}
	if len(lowers) == 0 {
		return dir, func() { _ = os.Remove(dir) }, nil
	}
	// Overlay without an upper dir is read-only and needs two lower dirs at least.
	m := mount.Mount{Type: "overlay", Source: "overlay", Options: []string{"ro", "lowerdir=" + strings.Join(lowers, ":")}}
	if err := mount.All([]mount.Mount{m}, dir); err != nil {
		_ = os.Remove(dir)
		return "", nil, fmt.Errorf("mount lower layers: %w", err)
	}
	return dir, func() {
		if err := mount.Unmount(dir); err != nil {
			s.log.Warn("unmount lower layers", "dir", dir, "err", err)
			return
		}
		_ = os.Remove(dir)
	}, nil
}

// ApplyRootfsDiff applies a rootfs diff from a checkpoint archive to the writable
// snapshot key: r is a layer tar (whiteouts delete), deleted lists further paths to
// remove (CRI-O's deleted.files). The snapshot is mounted for the time of the apply,
// so files of the image are replaced and removed as the container saw them. Entries
// that would escape the rootfs (.., absolute links followed, hard links out) are
// refused by containerd's applier, deletions by securejoin.
func (s *Service) ApplyRootfsDiff(ctx context.Context, key string, r io.Reader, deleted []string) (retErr error) {
	ms, err := s.snaps.Mounts(key)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(s.cfg.Root, "tmp-restore-")
	if err != nil {
		return fmt.Errorf("apply rootfs diff: %w", err)
	}
	defer os.Remove(dir)
	mounts := make([]mount.Mount, 0, len(ms))
	for _, m := range ms {
		mounts = append(mounts, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	if err := mount.All(mounts, dir); err != nil {
		return fmt.Errorf("apply rootfs diff: mount snapshot %s: %w", key, err)
	}
	defer func() {
		if err := mount.Unmount(dir); err != nil && retErr == nil {
			retErr = fmt.Errorf("apply rootfs diff: %w", err)
		}
	}()
	if r != nil {
		if _, err := archive.Apply(ctx, dir, r); err != nil {
			return fmt.Errorf("apply rootfs diff to snapshot %s: %w", key, err)
		}
	}
	for _, p := range deleted {
		full, err := securejoin.SecureJoin(dir, p)
		if err != nil {
			return fmt.Errorf("deleted file %q: %w", p, err)
		}
		if full == dir {
			return fmt.Errorf("deleted file %q names the root", p)
		}
		if err := os.RemoveAll(full); err != nil {
			return fmt.Errorf("remove deleted file %q: %w", p, err)
		}
	}
	return nil
}
