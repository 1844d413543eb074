package mount

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

// userNSProcess starts a process in a new user namespace mapping 0 -> 100000 (65536
// ids) and returns its pid; it is killed when the test ends.
func userNSProcess(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// overlayTree makes, in a directory traversable by any uid (host uid 100000 writes
// below it), an overlay's lower layers l1 (holding a) and l2 (holding b), its
// snapshot's upper and work dirs snap/fs and snap/work, and its mount point merged,
// all root-owned; it returns the directory.
func overlayTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"l1", "l2", "snap/fs", "snap/work", "merged"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"l1/a", "l2/b"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(filepath.Base(f)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// overlayOptions returns the overlay options of overlayTree's layout in dir: l1 over
// l2, snap/fs the upper dir.
func overlayOptions(dir string) []string {
	return []string{
		"workdir=" + filepath.Join(dir, "snap/work"), "upperdir=" + filepath.Join(dir, "snap/fs"),
		"lowerdir=" + filepath.Join(dir, "l1") + ":" + filepath.Join(dir, "l2"),
	}
}

func owner(t *testing.T, path string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}

// TestAllIDMappedOverlay: through idmapped layers the root-owned lower files appear
// owned by the namespace's root (host 100000); a file created by host uid 100000 (the
// container's root) is stored as 0 in the upper dir; the layers' staging mounts are
// gone once the overlay is mounted; and once it is unmounted no mount is left.
func TestAllIDMappedOverlay(t *testing.T) {
	testutil.RequiresRoot(t, "mounts")
	pid := userNSProcess(t)
	uid, gid, err := HostRootIDs(pid)
	if err != nil || uid != 100000 || gid != 100000 {
		t.Fatalf("HostRootIDs = %d, %d, %v; want 100000, 100000", uid, gid, err)
	}
	dir := overlayTree(t)
	if err := os.Chown(filepath.Join(dir, "l2/b"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	merged := filepath.Join(dir, "merged")
	ms := []Mount{{Type: "overlay", Source: "overlay", Options: append(overlayOptions(dir), "index=off")}}
	if err := AllIDMapped(ms, merged, IDMap{UserNS: fmt.Sprintf("/proc/%d/ns/user", pid), RootUID: uid, RootGID: gid}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(merged) })
	if mounts := mountsBelow(t, dir); len(mounts) != 1 || mounts[0] != merged {
		t.Errorf("mounts below %s with the overlay up: %v, want only %s", dir, mounts, merged)
	}
	if _, err := os.Stat(stagingDir(merged)); !os.IsNotExist(err) {
		t.Errorf("staging dir left: %v", err)
	}
	if got := owner(t, filepath.Join(merged, "a")); got != 100000 {
		t.Errorf("lower file a owned by %d on the host through the overlay, want 100000", got)
	}
	if got := owner(t, filepath.Join(merged, "b")); got != 101000 {
		t.Errorf("lower file b (1000 on disk) owned by %d, want 101000", got)
	}
	// The container's root is host uid 100000: write as that.
	cmd := exec.Command("sh", "-c", "echo x > "+filepath.Join(merged, "new")+" && echo y >> "+filepath.Join(merged, "a"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 100000, Gid: 100000}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write as host uid 100000: %v: %s", err, out)
	}
	if got := owner(t, filepath.Join(merged, "new")); got != 100000 {
		t.Errorf("new file owned by %d through the overlay, want 100000", got)
	}
	for _, f := range []string{"new", "a"} {
		if got := owner(t, filepath.Join(dir, "snap/fs", f)); got != 0 {
			t.Errorf("%s owned by %d in the upper dir on disk, want 0 (the in-container id)", f, got)
		}
	}
	if err := Unmount(merged); err != nil {
		t.Fatal(err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), dir) {
		t.Errorf("mounts under %s left after unmount:\n%s", dir, mi)
	}
}

// mountsBelow lists the mount points below dir.
func mountsBelow(t *testing.T, dir string) []string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// TestUnmountRemovesStaging: staging mounts a crash left between attaching an
// idmapped layer and mounting the overlay are detached by Unmount of the target, and
// the layer's files are untouched (the layer was attached read-only).
func TestUnmountRemovesStaging(t *testing.T) {
	testutil.RequiresRoot(t, "mounts")
	dir := t.TempDir()
	layer, target := filepath.Join(dir, "layer"), filepath.Join(dir, "rootfs")
	for _, d := range []string{layer, target} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(layer, "f"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", userNSProcess(t)), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(userns)
	fd, err := idmappedTree(layer, userns, true)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := os.Mkdir(stagingDir(target), 0o711); err != nil {
		t.Fatal(err)
	}
	staged, err := attachStaged(fd, stagingDir(target), "1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(staged, "f")); err == nil {
		t.Fatal("a file of a read-only staged layer could be removed")
	}
	if err := Unmount(target); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if _, err := os.Stat(stagingDir(target)); !os.IsNotExist(err) {
		t.Errorf("staging dir left: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(layer, "f")); err != nil || string(data) != "keep" {
		t.Errorf("layer file after cleanup: %q %v", data, err)
	}
}

func TestAllIDMappedBind(t *testing.T) {
	testutil.RequiresRoot(t, "mounts")
	pid := userNSProcess(t)
	src, dst := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := AllIDMapped([]Mount{{Type: "bind", Source: src, Options: []string{"rbind", "ro"}}}, dst, IDMap{UserNS: fmt.Sprintf("/proc/%d/ns/user", pid)})
	if err != nil {
		t.Fatal(err)
	}
	defer Unmount(dst)
	if got := owner(t, filepath.Join(dst, "f")); got != 100000 {
		t.Errorf("f owned by %d through the idmapped bind, want 100000", got)
	}
	if err := os.WriteFile(filepath.Join(dst, "g"), nil, 0o644); err == nil {
		t.Error("write to a read-only idmapped bind succeeded")
	}
}

func TestUserNSPid(t *testing.T) {
	for path, want := range map[string]int{"/proc/42/ns/user": 42, "/proc/self/ns/user": 0, "/proc/42/ns/net": 0, "/proc/42/ns/user/x": 0, "/run/userns": 0} {
		got, err := UserNSPid(path)
		if got != want || (want == 0) != (err != nil) {
			t.Errorf("UserNSPid(%q) = %d, %v; want %d", path, got, err, want)
		}
	}
}
