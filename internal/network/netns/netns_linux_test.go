package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

// rootWhy is what the netns tests need root for (testutil.RequiresRoot).
const rootWhy = "creates network namespaces and mounts"

// testDir returns a pin directory that is unmounted again when the test ends.
func testDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() {
		// The bind mount New put on dir; loop in case a test stacked more than one.
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	return dir
}

func TestNewRemove(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	dir := testDir(t)

	path, err := New(dir, "pod1")
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = Remove(path) })
	if want := filepath.Join(dir, "pod1"); path != want {
		t.Fatalf("path = %q, want %q", path, want)
	}
	if !IsPinned(path) {
		t.Fatalf("%s is not an nsfs mount", path)
	}
	if !isSharedMount(t, dir) {
		t.Errorf("%s is not a shared mount point", dir)
	}

	h, err := vns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open pinned netns: %v", err)
	}
	defer h.Close()
	self, err := vns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	if h.Equal(self) {
		t.Fatal("pinned namespace is the test's own namespace")
	}
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netlink handle in netns: %v", err)
	}
	defer nh.Close()
	links, err := nh.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Fatalf("links in new netns = %v, want only lo", links)
	}
	if links[0].Attrs().Flags&net.FlagUp == 0 {
		t.Fatal("lo is not up in the new netns")
	}
	addrs, err := nh.AddrList(links[0], netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 || !addrs[0].IP.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Fatalf("lo addresses = %v, %v; want 127.0.0.1", addrs, err)
	}

	// A second namespace is distinct and the first one survives its removal.
	path2, err := New(dir, "pod2")
	if err != nil {
		t.Fatalf("second New: %v", err)
	}
	h2, err := vns.GetFromPath(path2)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Equal(h) {
		t.Error("two pods share one namespace")
	}
	h2.Close()
	if err := Remove(path2); err != nil {
		t.Fatal(err)
	}
	if !IsPinned(path) {
		t.Fatal("removing pod2 unpinned pod1")
	}

	if _, err := New(dir, "pod1"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("New over an existing pin: err = %v, want ErrExist", err)
	}
	if !IsPinned(path) {
		t.Fatal("a refused New disturbed the existing pin")
	}

	for i := range 2 {
		if err := Remove(path); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("pin file still there after Remove: %v", err)
	}
	if IsPinned(path) {
		t.Fatal("IsPinned true after Remove")
	}
	if mounted(t, path) {
		t.Fatal("a mount is left at the removed path")
	}
}

func TestNewRejectsBadNames(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"", ".", "..", "a/b", "/abs", "../escape", "x/", "nul\x00"} {
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			if _, err := New(dir, name); err == nil || !strings.Contains(err.Error(), "invalid netns name") {
				t.Fatalf("New(%q) err = %v, want invalid name", name, err)
			}
		})
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("refused names left files behind: %v", entries)
	}
}

func TestRemove(t *testing.T) {
	tmp := t.TempDir()
	plain := filepath.Join(tmp, "plain")
	if err := os.WriteFile(plain, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		wantErr bool
	}{
		{"missing file", filepath.Join(tmp, "nope"), false},
		{"unmounted leftover file", plain, false},
		{"directory refused", tmp, true},
		{"empty path refused", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Remove(tc.path)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Remove(%q) = %v, wantErr %v", tc.path, err, tc.wantErr)
			}
		})
	}
	if _, err := os.Stat(plain); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("leftover file not removed: %v", err)
	}
	if IsPinned(tmp) || IsPinned(filepath.Join(tmp, "nope")) {
		t.Error("IsPinned true for a plain directory or a missing file")
	}
}

// TestRemoveBusy covers the two ways a pin resists a plain unmount: an open file
// descriptor through the mount (EBUSY, so MNT_DETACH) and a mount stacked on top.
func TestRemoveBusy(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	dir := testDir(t)
	tests := []struct {
		name string
		busy func(t *testing.T, path string)
	}{
		{"open fd", func(t *testing.T, path string) {
			h, err := vns.GetFromPath(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
		}},
		{"stacked mount", func(t *testing.T, path string) {
			if err := unix.Mount(path, path, "none", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path, err := New(dir, fmt.Sprintf("busy%d", i))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = Remove(path) })
			tc.busy(t, path)
			if err := Remove(path); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("pin file still there: %v", err)
			}
			if mounted(t, path) {
				t.Fatal("a mount is left at the removed path")
			}
		})
	}
}

// TestNoThreadLeftInside: Go parks rather than ends a locked main thread, so New
// must bring its thread back out, or that thread keeps a removed pod's namespace
// (and veth) alive for the life of the process.
func TestNoThreadLeftInside(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	dir := testDir(t)
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				path, err := New(dir, fmt.Sprintf("thr-%d-%d", g, i))
				if err != nil {
					t.Error(err)
					return
				}
				if err := Remove(path); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if ns, err := os.Readlink(task); err == nil && ns != host {
			t.Errorf("thread %s is in %s, not the host's %s", task, ns, host)
		}
	}
}

func TestNewTiming(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	dir := testDir(t)
	var newTotal, rmTotal time.Duration
	const n = 20
	for i := range n {
		start := time.Now()
		path, err := New(dir, "t"+string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		mid := time.Now()
		if err := Remove(path); err != nil {
			t.Fatal(err)
		}
		newTotal += mid.Sub(start)
		rmTotal += time.Since(mid)
	}
	t.Logf("netns.New avg %v, Remove avg %v over %d runs", newTotal/n, rmTotal/n, n)
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func isSharedMount(t *testing.T, path string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	shared := false
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) > 6 && f[4] == path {
			// The last mount listed for a path is the visible one.
			shared = strings.Contains(strings.Join(f[6:], " "), "shared:")
		}
	}
	return shared
}
