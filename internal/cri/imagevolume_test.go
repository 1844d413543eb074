package cri

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// imageTree builds a stand-in for a mounted image: directories, a file, and symlinks
// that stay inside or lead out of it; next to it, a directory the links must not reach.
func imageTree(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "image"), filepath.Join(base, "secret")
	for _, d := range []string{root + "/data/models", root + "/etc", outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(root+"/data/file", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"data/current": "models",           // relative, inside
		"data/up":      "../etc",           // relative, climbs but stays inside
		"data/escape":  "../../secret",     // relative, leads out
		"data/abs":     "/etc",             // absolute: os.Root refuses these
		"data/loop":    "loop",             // itself
		"data/dangles": "missing",          // to nothing
		"data/tofile":  "file",             // to a file
		"data/deep":    "current/../../..", // through a link, then out
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root, outside
}

func TestResolveImageSubPath(t *testing.T) {
	root, _ := imageTree(t)
	cases := []struct {
		sub  string
		want string // relative to root; "" with bad set means an error
		bad  bool
	}{
		{sub: "", want: "."},
		{sub: "data", want: "data"},
		{sub: "data/models", want: "data/models"},
		{sub: "./data//models/", want: "data/models"},
		{sub: "data/../etc", want: "etc"},
		{sub: "data/current", want: "data/models"},
		{sub: "data/up", want: "etc"},
		{sub: "..", bad: true},
		{sub: "../secret", bad: true},
		{sub: "data/../../secret", bad: true},
		{sub: "/data", bad: true},
		{sub: "data/escape", bad: true},
		{sub: "data/abs", bad: true},
		{sub: "data/deep", bad: true},
		{sub: "data/loop", bad: true},
		{sub: "data/dangles", bad: true},
		{sub: "missing", bad: true},
		{sub: "data/file", bad: true},
		{sub: "data/tofile", bad: true},
	}
	for _, c := range cases {
		t.Run(c.sub, func(t *testing.T) {
			got, err := resolveImageSubPath(root, c.sub)
			if c.bad {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("resolveImageSubPath(%q) = %q, %v; want InvalidArgument", c.sub, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolveImageSubPath(%q): %v", c.sub, err)
			}
			if want := filepath.Join(root, c.want); got != want {
				t.Errorf("resolveImageSubPath(%q) = %q, want %q", c.sub, got, want)
			}
		})
	}
}

func TestHasImageVolumes(t *testing.T) {
	cases := []struct {
		name   string
		mounts []*runtime.Mount
		want   bool
	}{
		{"none", nil, false},
		{"host paths", []*runtime.Mount{{ContainerPath: "/a", HostPath: "/tmp"}}, false},
		{"image", []*runtime.Mount{{ContainerPath: "/a", HostPath: "/tmp"}, {ContainerPath: "/b", Image: &runtime.ImageSpec{Image: "x"}}}, true},
		{"empty image spec", []*runtime.Mount{{ContainerPath: "/a", HostPath: "/tmp", Image: &runtime.ImageSpec{}}}, false},
		// Caught so that mountImageVolumes refuses it rather than the spec ignoring it.
		{"sub path alone", []*runtime.Mount{{ContainerPath: "/a", HostPath: "/tmp", ImageSubPath: "d"}}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := hasImageVolumes(&runtime.ContainerConfig{Mounts: c.mounts}); got != c.want {
				t.Errorf("hasImageVolumes = %v, want %v", got, c.want)
			}
		})
	}
}
