package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/mount"
)

// TestViewMountsReadOnlyAndPinsImage mounts read-only views of a one-layer image (a
// read-only bind) and a two-layer one (an overlay without upper dir): the files are
// there, nothing can be written, and the image cannot be removed until the view is
// dropped, across a restart too.
func TestViewMountsReadOnlyAndPinsImage(t *testing.T) {
	cases := []struct {
		name   string
		layers [][]imagetest.TarEntry
		want   map[string]string
	}{
		{"one layer", [][]imagetest.TarEntry{{imagetest.File("a", "alpha")}}, map[string]string{"a": "alpha"}},
		{"two layers", [][]imagetest.TarEntry{
			{imagetest.File("a", "alpha"), imagetest.File("gone", "x")},
			{imagetest.File("b", "beta"), imagetest.Whiteout("gone")},
		}, map[string]string{"a": "alpha", "b": "beta", "gone": ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			host := imagetest.StartRegistry(t)
			var layers []v1.Layer
			for _, entries := range c.layers {
				layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, entries...))
			}
			imagetest.Push(t, host, "data:v1", imagetest.NewImage(t, imagetest.ImageOptions{}, layers...))
			ctx := context.Background()
			ref := host + "/data:v1"
			img, err := f.svc.Pull(ctx, ref, nil)
			if err != nil {
				t.Fatal(err)
			}
			ms, err := f.svc.View("c1/0", img)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.svc.View("c1/0", img); !errdefs.IsAlreadyExists(err) {
				t.Errorf("second view under the same key: %v; want AlreadyExists", err)
			}
			target := t.TempDir()
			var mms []mount.Mount
			for _, m := range ms {
				mms = append(mms, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
			}
			if err := mount.All(mms, target); err != nil {
				t.Fatal(err)
			}
			defer mount.Unmount(target)
			for name, body := range c.want {
				data, err := os.ReadFile(filepath.Join(target, name))
				if body == "" {
					if !errors.Is(err, os.ErrNotExist) {
						t.Errorf("%s: whited out, but read %q, %v", name, data, err)
					}
					continue
				}
				if err != nil || string(data) != body {
					t.Errorf("%s: %q, %v; want %q", name, data, err, body)
				}
			}
			if err := os.WriteFile(filepath.Join(target, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
				t.Errorf("write into the view: %v; want EROFS", err)
			}

			for _, r := range []string{ref, img.ID} {
				if err := f.svc.Remove(ctx, r); !errdefs.IsFailedPrecondition(err) {
					t.Fatalf("Remove %s while viewed: %v; want FailedPrecondition", r, err)
				}
			}
			f.open() // a restart keeps the view, and so the refusal and the layers
			if err := f.svc.Remove(ctx, ref); !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("Remove after a restart while viewed: %v", err)
			}
			if keys, err := f.svc.ViewKeys(); err != nil || len(keys) != 1 || keys[0] != "c1/0" {
				t.Errorf("ViewKeys = %v, %v", keys, err)
			}
			if err := mount.Unmount(target); err != nil {
				t.Fatal(err)
			}
			if err := f.svc.RemoveView("c1/0"); err != nil {
				t.Fatal(err)
			}
			if err := f.svc.Remove(ctx, ref); err != nil {
				t.Fatalf("Remove after the view went: %v", err)
			}
			if snaps, _ := f.svc.snaps.List(); len(snaps) != 0 {
				t.Errorf("%d layer snapshots left after removal", len(snaps))
			}
			if _, err := f.svc.View("c2/0", img); !errdefs.IsNotFound(err) {
				t.Errorf("view of a removed image: %v; want NotFound", err)
			}
		})
	}
}
