package netns

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

// TestPin: Pin pins the network namespace a process made (here inside a new user
// namespace, as a userns pod's pause process does), brings its lo up, and Remove
// unpins it.
func TestPin(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}},
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	dir := testDir(t)
	path, err := Pin(dir, "userns", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var pinned, proc unix.Stat_t
	if err := unix.Stat(path, &pinned); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), &proc); err != nil {
		t.Fatal(err)
	}
	if pinned.Ino != proc.Ino {
		t.Fatalf("pinned namespace %d is not the process's %d", pinned.Ino, proc.Ino)
	}
	h, err := vns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	lo, err := nl.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		t.Error("lo is down in the pinned namespace")
	}
	if _, err := Pin(dir, "userns", cmd.Process.Pid); err == nil {
		t.Error("a second Pin under the same name succeeded")
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("pin %s still there after Remove: %v", path, err)
	}
	if _, err := Pin(dir, "gone", 0); err == nil {
		t.Error("Pin of pid 0 succeeded")
	}
}
