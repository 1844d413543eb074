package e2e

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/crisp-runtime/crisp/internal/proc"
)

// inNetns runs fn on a thread switched into the network namespace at path.
func inNetns(t *testing.T, path string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open netns %s: %v", path, err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("cannot return to the test's netns: %v", err))
		}
	}()
	fn()
}

// echoServer listens on a TCP port inside a pod's netns and echoes one line back
// per connection, prefixed with who answered.
func echoServer(t *testing.T, nsPath, name string) int {
	t.Helper()
	var l net.Listener
	inNetns(t, nsPath, func() {
		var err error
		l, err = net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				n, _ := c.Read(buf)
				fmt.Fprintf(c, "%s:%s", name, buf[:n])
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// exchange dials addr (from the given netns, or the host when nsPath is "") and
// returns the echo.
func exchange(t *testing.T, nsPath, addr string) string {
	t.Helper()
	var c net.Conn
	var err error
	dial := func() { c, err = net.DialTimeout("tcp4", addr, 3*time.Second) }
	if nsPath == "" {
		dial()
	} else {
		inNetns(t, nsPath, dial)
	}
	if err != nil {
		t.Fatalf("connect to %s from %q: %v", addr, nsPath, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func nsenterOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// alive reports whether pid can still run code: not gone, not a zombie, not in exit
// (a pid namespace's init stays in exit until the host init reaped its namespace).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	st, err := proc.ReadStat(pid)
	return err == nil && !st.Exiting()
}

// nsInode is the inode of a namespace file. The tests' own namespaces are read as
// /proc/thread-self/ns/*: /proc/self/ns/* are the main thread's, which a parallel
// test's inNetns may have switched into a pod's netns at that moment (a
// TestE2EUsernsHostNetwork failure in CI came from it); the calling thread is never
// a switched one, since inNetns locks its goroutine to its thread.
func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Ino
}

// ipamReservations lists the IPs host-local still holds below the env's root.
func (e *env) ipamReservations() []string {
	var out []string
	_ = filepath.Walk(filepath.Join(e.root, "cni", "networks"), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && net.ParseIP(info.Name()) != nil {
			out = append(out, info.Name())
		}
		return nil
	})
	return out
}

// vethsOnBridge lists the interfaces attached to the env's bridge.
func (e *env) vethsOnBridge() []string {
	out, _ := exec.Command("ip", "-o", "link", "show", "master", e.bridge).Output()
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			names = append(names, strings.TrimSuffix(f[1], ":"))
		}
	}
	return names
}

// podCgroups lists cgroup directories left below the env's cgroup parent.
func (e *env) podCgroups() []string {
	var out []string
	for _, ctrl := range append(cgroupControllers(), "unified") {
		entries, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctrl, e.cgroup))
		for _, en := range entries {
			if en.IsDir() {
				out = append(out, filepath.Join(ctrl, e.cgroup, en.Name()))
			}
		}
	}
	return out
}
