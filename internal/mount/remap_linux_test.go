package mount

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

func TestRemapOptions(t *testing.T) {
	for _, tc := range []struct {
		opts         []string
		rest         []string
		uidmap, gmap string
		ok           bool
	}{
		{[]string{"index=off", "uidmap=0:100000:65536", "gidmap=0:100000:65536", "lowerdir=/a"}, []string{"index=off", "lowerdir=/a"}, "0:100000:65536", "0:100000:65536", true},
		{[]string{"uidmap=0:1:2", "rbind"}, []string{"rbind"}, "0:1:2", "", false},
		{[]string{"rbind", "ro"}, []string{"rbind", "ro"}, "", "", false},
	} {
		rest, u, g, ok := remapOptions(tc.opts)
		if strings.Join(rest, ",") != strings.Join(tc.rest, ",") || u != tc.uidmap || g != tc.gmap || ok != tc.ok {
			t.Errorf("remapOptions(%q) = %q %q %q %v", tc.opts, rest, u, g, ok)
		}
	}
}

func TestParseIDMaps(t *testing.T) {
	if m, err := parseIDMaps("0:100000:65536,65536:300000:10"); err != nil || len(m) != 2 || m[1].HostID != 300000 || m[0].Size != 65536 {
		t.Errorf("parseIDMaps = %v, %v", m, err)
	}
	for _, bad := range []string{"", "0:1", "0:1:0", "a:1:2", "0:1:2:3", "-1:1:2", "0:4294967296:1"} {
		if _, err := parseIDMaps(bad); err == nil {
			t.Errorf("parseIDMaps(%q) succeeded", bad)
		}
	}
}

// TestAllRemappedOverlay: an overlay with containerd's uidmap=/gidmap= options (an
// overlayfs snapshot prepared for a user namespace) is mounted as containerd mounts
// it: the lower layers are idmapped (root-owned files appear as the mapped root,
// 100000), the upper dir is used as it is, so what the container's root writes is
// stored as host uid 100000; no staging mount stays, nothing after Unmount.
func TestAllRemappedOverlay(t *testing.T) {
	testutil.RequiresRoot(t, "mounts")
	dir := overlayTree(t)
	// containerd's snapshotter chowns the upper dir to the mapped root.
	if err := os.Chown(filepath.Join(dir, "snap/fs"), 100000, 100000); err != nil {
		t.Fatal(err)
	}
	merged := filepath.Join(dir, "merged")
	ms := []Mount{{Type: "overlay", Source: "overlay",
		Options: append(overlayOptions(dir), "index=off", "uidmap=0:100000:65536", "gidmap=0:100000:65536")}}
	if !Remapped(ms) {
		t.Fatal("Remapped = false for a mount with uidmap and gidmap")
	}
	if err := All(ms, merged); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(merged) })
	if mounts := mountsBelow(t, dir); len(mounts) != 1 || mounts[0] != merged {
		t.Errorf("mounts below %s with the overlay up: %v, want only %s", dir, mounts, merged)
	}
	for _, f := range []string{"a", "b"} {
		if got := owner(t, filepath.Join(merged, f)); got != 100000 {
			t.Errorf("lower file %s owned by %d through the overlay, want 100000", f, got)
		}
	}
	cmd := exec.Command("sh", "-c", "echo x > "+filepath.Join(merged, "new")+" && echo y >> "+filepath.Join(merged, "a"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 100000, Gid: 100000}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write as host uid 100000 (the container's root): %v: %s", err, out)
	}
	for _, f := range []string{"new", "a"} {
		if got := owner(t, filepath.Join(dir, "snap/fs", f)); got != 100000 {
			t.Errorf("%s owned by %d in the upper dir on disk, want 100000 (host ids, as containerd stores them)", f, got)
		}
	}
	if got := owner(t, filepath.Join(dir, "l1/a")); got != 0 {
		t.Errorf("the lower layer's file is now owned by %d, want 0 (untouched)", got)
	}
	if err := Unmount(merged); err != nil {
		t.Fatal(err)
	}
	if mounts := mountsBelow(t, dir); len(mounts) != 0 {
		t.Errorf("mounts left after Unmount: %v", mounts)
	}
}

// TestAllRemappedBind: a bind mount with uidmap/gidmap is idmapped as a whole.
func TestAllRemappedBind(t *testing.T) {
	testutil.RequiresRoot(t, "mounts")
	src, dst := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := All([]Mount{{Type: "bind", Source: src, Options: []string{"rbind", "rw", "uidmap=0:100000:65536", "gidmap=0:100000:65536"}}}, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmount(dst)
	if got := owner(t, filepath.Join(dst, "f")); got != 100000 {
		t.Errorf("f owned by %d through the idmapped bind, want 100000", got)
	}
	if err := All([]Mount{{Type: "bind", Source: src, Options: []string{"rbind", "uidmap=0:1:x", "gidmap=0:1:1"}}}, dst); err == nil || !strings.Contains(err.Error(), "uidmap") {
		t.Errorf("All with a bad uidmap: %v, want an error naming uidmap", err)
	}
}

// TestUserNSFileLeaksNoFD: making a user namespace leaves no file of it open in a
// process another goroutine starts meanwhile. Go's own UidMappings write the child's
// uid_map through a file opened without O_CLOEXEC while other forks may run (Go lets
// forks proceed concurrently): in the SELinux node VM a shim criserver started at that
// moment inherited /proc/<pid>/uid_map (its exec closed it with an AVC denial).
func TestUserNSFileLeaksNoFD(t *testing.T) {
	testutil.RequiresRoot(t, "user namespaces")
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			f, err := userNSFile("0:100000:65536", "0:100000:65536")
			if err != nil {
				done <- err
				return
			}
			f.Close()
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	runs, leaked := 0, false
	for !leaked && time.Now().Before(deadline) {
		out, err := exec.Command("ls", "-l", "/proc/self/fd").Output()
		if err != nil {
			t.Fatal(err)
		}
		runs++
		if leaked = strings.Contains(string(out), "_map"); leaked {
			t.Errorf("a process started while a user namespace was made inherited its id map file (run %d):\n%s", runs, out)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d processes started", runs)
}
