package runc

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/crisp-runtime/crisp/internal/mount"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// TestChownedFor: a snapshot whose writable layer belongs to the user namespace's root
// (containerd's chowned snapshot, host ids on disk) is told apart from crisp's own
// (in-container ids), which gets idmapped layers.
func TestChownedFor(t *testing.T) {
	testutil.RequiresRoot(t, "chowns files to other users")
	dir := t.TempDir()
	mk := func(name string, uid int) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	chowned, own := mk("chowned", 100000), mk("own", 0)
	overlay := func(upper string) mount.Mount {
		opts := []string{"lowerdir=" + dir}
		if upper != "" {
			opts = append(opts, "upperdir="+upper, "workdir="+filepath.Join(dir, "work"))
		}
		return mount.Mount{Type: "overlay", Source: "overlay", Options: opts}
	}
	for _, tc := range []struct {
		name string
		ms   []mount.Mount
		want bool
	}{
		{"overlay, upper owned by the mapped root", []mount.Mount{overlay(chowned)}, true},
		{"overlay, upper owned by host root", []mount.Mount{overlay(own)}, false},
		{"overlay without upper", []mount.Mount{overlay("")}, false},
		{"bind owned by the mapped root", []mount.Mount{{Type: "bind", Source: chowned, Options: []string{"rbind", "rw"}}}, true},
		{"bind owned by host root", []mount.Mount{{Type: "bind", Source: own, Options: []string{"rbind", "rw"}}}, false},
		{"missing upper", []mount.Mount{overlay(filepath.Join(dir, "nope"))}, false},
		{"two mounts", []mount.Mount{overlay(chowned), overlay(chowned)}, false},
	} {
		if got := chownedFor(tc.ms, 100000, 100000); got != tc.want {
			t.Errorf("%s: chownedFor = %v, want %v", tc.name, got, tc.want)
		}
	}
}
