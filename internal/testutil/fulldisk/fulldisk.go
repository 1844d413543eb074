package fulldisk

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

// MountNoCleanup mounts a tmpfs with opts ("size=8m", "size=8m,nr_inodes=64") on dir,
// which must exist, and skips the test when not root. It leaves the unmount to the
// caller, for one whose own cleanup must run first (a daemon using the mount stopped).
func MountNoCleanup(t testing.TB, dir, opts string) {
	t.Helper()
	testutil.RequiresRoot(t, "mounts a size-limited tmpfs")
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Fatalf("mount tmpfs (%s) on %s: %v", opts, dir, err)
	}
}

// Mount is MountNoCleanup, and unmounts dir (MNT_DETACH) when the test ends.
func Mount(t testing.TB, dir, opts string) {
	t.Helper()
	MountNoCleanup(t, dir, opts)
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// New mounts a tmpfs with opts on a new t.TempDir() and returns it (see Mount).
func New(t testing.TB, opts string) string {
	t.Helper()
	dir := t.TempDir()
	Mount(t, dir, opts)
	return dir
}

// Resize remounts the tmpfs on dir with a new size ("512m"), as an operator freeing
// space would. Other options are kept.
func Resize(t testing.TB, dir, size string) {
	t.Helper()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_REMOUNT, "size="+size); err != nil {
		t.Fatalf("resize tmpfs on %s to %s: %v", dir, size, err)
	}
}

// Fill writes zeros to a new file at path until the filesystem is full (ENOSPC) and
// returns the bytes written. Any other error fails the test.
func Fill(t testing.TB, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		if err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
}

// LowestFree samples the free space of the filesystem holding dir every 2 ms until
// stop is closed, then sends the lowest value seen (-1 if statfs never succeeded).
// Free space is what an unprivileged writer may use: f_bavail * f_bsize.
func LowestFree(dir string, stop <-chan struct{}) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		low := int64(-1)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			var st unix.Statfs_t
			if err := unix.Statfs(dir, &st); err == nil {
				if free := int64(st.Bavail) * int64(st.Bsize); low < 0 || free < low {
					low = free
				}
			}
			select {
			case <-stop:
				out <- low
				return
			case <-tick.C:
			}
		}
	}()
	return out
}
