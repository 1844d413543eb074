package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bootstrap "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"google.golang.org/protobuf/proto"
)

func TestParseStartResult(t *testing.T) {
	pb, _ := proto.Marshal(&bootstrap.BootstrapResult{Version: 3, Address: "unix:///run/crisp/s/abc", Protocol: "ttrpc"})
	pb2, _ := proto.Marshal(&bootstrap.BootstrapResult{Version: 2, Address: "unix:///run/crisp/s/v2", Protocol: "ttrpc"})
	grpcPB, _ := proto.Marshal(&bootstrap.BootstrapResult{Version: 3, Address: "unix:///x", Protocol: "grpc"})
	future, _ := proto.Marshal(&bootstrap.BootstrapResult{Version: 4, Address: "unix:///x", Protocol: "ttrpc"})
	cases := []struct {
		name    string
		out     []byte
		want    string
		version int
		wantErr string
	}{
		{"protobuf", pb, "unix:///run/crisp/s/abc", 3, ""},
		{"protobuf v2", pb2, "unix:///run/crisp/s/v2", 2, ""},
		{"json", []byte(`{"version":3,"address":"unix:///a","protocol":"ttrpc"}`), "unix:///a", 3, ""},
		{"json v2", []byte(`{"version":2,"address":"unix:///a"}`), "unix:///a", 2, ""},
		{"bare", []byte("unix:///b\n"), "unix:///b", 2, ""},
		{"empty", nil, "", 0, "no address"},
		{"grpc protocol", grpcPB, "", 0, "needs ttrpc"},
		{"future version", future, "", 0, "newer"},
		{"garbage", []byte("\xff\xfe"), "", 0, "neither"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, version, err := parseStartResult(tc.out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want || version != tc.version {
				t.Fatalf("got %q v%d, %v; want %q v%d", got, version, err, tc.want, tc.version)
			}
		})
	}
}

// A `start` that criserver exec'd just before it died is found by its command line,
// so Recover waits for it even before it takes the bundle lock.
func TestWaitShimStartSeesStartProcess(t *testing.T) {
	id := fmt.Sprintf("pod-%d", os.Getpid())
	cmd := exec.Command("sh", "-c", "sleep 0.3; :", "-id", id, "start")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if !shimStartRunning(id) {
		t.Fatal("start process not seen")
	}
	if shimStartRunning(id + "x") {
		t.Error("start process of another pod seen")
	}
	t0 := time.Now()
	waitShimStart(context.Background(), t.TempDir(), id, 5*time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("waited %v for a start that took 0.3 s", took)
	}
	if shimStartRunning(id) {
		t.Error("start process seen after it exited")
	}
}

func TestWaitShimStartHonoursLimit(t *testing.T) {
	bundle := t.TempDir()
	d, err := os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Another open file description holds the lock, as a running start would.
	if err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	waitShimStart(context.Background(), bundle, "nobody", 100*time.Millisecond)
	if took := time.Since(t0); took < 100*time.Millisecond || took > 2*time.Second {
		t.Errorf("waited %v on a held lock with a 100 ms limit", took)
	}
}

// Recover's sweep removes a socket nobody listens on and no pod owns, and keeps a pod's
// socket and any socket a process still answers on.
func TestRemoveStraySockets(t *testing.T) {
	state := t.TempDir()
	c := &Controller{opts: Options{StateDir: state}, sandboxes: map[string]*sandbox{}, log: slog.New(slog.DiscardHandler)}
	dir := c.opts.socketDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	bind := func(name string) *net.UnixListener {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, name), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		return l
	}
	bind("dead").Close()
	bind("owned").Close()
	live := bind("live")
	defer live.Close()
	if err := os.WriteFile(filepath.Join(dir, "not-a-socket"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c.sandboxes["pod"] = &sandbox{rec: record{ID: "pod", Address: "unix://" + filepath.Join(dir, "owned")}}
	c.removeStraySockets()
	for name, want := range map[string]bool{"dead": false, "owned": true, "live": true, "not-a-socket": true} {
		_, err := os.Stat(filepath.Join(dir, name))
		if got := err == nil; got != want {
			t.Errorf("%s: present %v, want %v", name, got, want)
		}
	}
}

func TestResolveShim(t *testing.T) {
	dir := t.TempDir()
	abs := filepath.Join(dir, "myshim")
	if err := os.WriteFile(abs, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	for _, tc := range []struct {
		name, shim string
		ok         bool
	}{
		{"absolute", abs, true},
		{"absolute missing", filepath.Join(dir, "nope"), false},
		{"on PATH", "myshim", true},
		{"nowhere", "no-such-shim-xyz", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ResolveShim(tc.shim)
			if (err == nil) != tc.ok || (tc.ok && p != abs) {
				t.Errorf("ResolveShim(%q) = %q, %v; want ok=%v", tc.shim, p, err, tc.ok)
			}
		})
	}
}

// A task-only shim criserver never heard from is found by its -id and working
// directory, never by the id alone, and never as a start or delete.
func TestFindShim(t *testing.T) {
	bundle := t.TempDir()
	id := fmt.Sprintf("pod-%d", os.Getpid())
	start := func(dir string, args ...string) *exec.Cmd {
		cmd := exec.Command("sh", append([]string{"-c", "sleep 30"}, args...)...)
		cmd.Dir = dir
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	start(t.TempDir(), "-id", id)                        // elsewhere
	start(bundle, "-id", id, "-bundle", bundle, "start") // a start
	if pid := findShim(bundle, id); pid != 0 {
		t.Errorf("found %d, want none yet", pid)
	}
	shim := start(bundle, "-namespace", "k8s.io", "-id", id, "-address", "")
	deadline := time.Now().Add(5 * time.Second)
	for findShim(bundle, id) != shim.Process.Pid && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if pid := findShim(bundle, id); pid != shim.Process.Pid {
		t.Errorf("found %d, want the shim %d", pid, shim.Process.Pid)
	}
}
