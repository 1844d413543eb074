package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/crisp-runtime/crisp/internal/testutil/fulldisk"
)

// TestPrepareFullDisk: creating a container's writable snapshot on a filesystem out of
// inodes (ENOSPC from mkdir) is ResourceExhausted and leaves no directory and no
// record; once inodes are freed the same Prepare succeeds.
func TestPrepareFullDisk(t *testing.T) {
	root, f := fullDiskFixture(t, "size=8m,nr_inodes=64")

	fillers := filepath.Join(root, "tmp-fillers") // a name Open would clean up
	if err := os.Mkdir(fillers, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		err := os.Mkdir(filepath.Join(fillers, fmt.Sprint(i)), 0o700)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.s.Prepare("ctr", "")
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("prepare with no inodes left: %v, want ResourceExhausted", err)
	}
	t.Logf("prepare with no inodes left: %v", err)
	if _, err := f.s.Mounts("ctr"); !errdefs.IsNotFound(err) {
		t.Errorf("a failed prepare left a record: %v", err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "tmp-fillers" {
			t.Errorf("a failed prepare left %s", e.Name())
		}
	}

	if err := os.RemoveAll(fillers); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Prepare("ctr", ""); err != nil {
		t.Fatalf("prepare once inodes are free: %v", err)
	}
}

// TestUnpackFullDisk: a layer larger than the space left is ResourceExhausted from
// Unpack (all layers unpack at once, so this is where a full disk shows) and leaves no
// directory.
func TestUnpackFullDisk(t *testing.T) {
	root, f := fullDiskFixture(t, "size=4m")
	data := layerTar(t, fileE("big", strings.Repeat("x", 8<<20), 0o644))
	if _, err := f.s.Unpack(context.Background(), "sha256:big", bytes.NewReader(data)); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "sha256:big") {
		t.Fatalf("Unpack of 8 MiB into 4: %v, want ResourceExhausted naming the layer", err)
	}
	if got := names(t, root); len(got) != 0 {
		t.Errorf("a failed Unpack left %v", got)
	}
}

// fullDiskFixture is a snapshotter whose root is a small tmpfs mounted with opts; the
// database stays on the disk. It returns the root too.
func fullDiskFixture(t *testing.T, opts string) (string, *fixture) {
	t.Helper()
	requireOverlay(t)
	base := t.TempDir()
	root := filepath.Join(base, "s")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	fulldisk.Mount(t, root, opts)
	return root, newFixture(t, base)
}
