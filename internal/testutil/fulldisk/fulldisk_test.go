package fulldisk

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func free(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// TestFill: Fill on a new 1 MiB tmpfs writes about 1 MiB and leaves nothing free;
// LowestFree, watching meanwhile, reports no more than the free space it started with.
func TestFill(t *testing.T) {
	dir := New(t, "size=1m")
	before := free(t, dir)
	stop := make(chan struct{})
	low := LowestFree(dir, stop)
	n := Fill(t, filepath.Join(dir, "filler"))
	time.Sleep(10 * time.Millisecond) // a sample or more of the full filesystem
	close(stop)
	lowest := <-low
	if n <= 0 || n > 1<<20 {
		t.Errorf("Fill wrote %d bytes to a 1 MiB tmpfs", n)
	}
	if after := free(t, dir); after != 0 {
		t.Errorf("%d bytes free after Fill", after)
	}
	if lowest < 0 || lowest > before {
		t.Errorf("LowestFree = %d, want 0 to %d", lowest, before)
	}
}

// TestResize: a full tmpfs resized larger has room again; Mount's cleanup unmounts it.
func TestResize(t *testing.T) {
	dir := New(t, "size=1m,nr_inodes=64")
	Fill(t, filepath.Join(dir, "filler"))
	Resize(t, dir, "2m")
	if err := os.WriteFile(filepath.Join(dir, "more"), make([]byte, 512<<10), 0o600); err != nil {
		t.Fatalf("write after resize: %v", err)
	}
}
