package daemon

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A socket held open only for a moment (a dead criserver's child between fork and
// exec) is free; one that keeps taking connections is not.
func TestSocketFree(t *testing.T) {
	path := filepath.Join(t.TempDir(), "crisp.sock")
	if err := socketFree(path); err != nil {
		t.Fatalf("no socket: %v", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	go func() {
		time.Sleep(200 * time.Millisecond)
		l.Close()
	}()
	if err := socketFree(path); err != nil {
		t.Errorf("socket held for 200 ms: %v", err)
	}

	path2 := filepath.Join(t.TempDir(), "crisp.sock")
	l2, err := net.Listen("unix", path2)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	start := time.Now()
	if err := socketFree(path2); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a served socket: %v", err)
	}
	if d := time.Since(start); d < socketBusyFor {
		t.Errorf("gave up after %v, want %v", d, socketBusyFor)
	}
}
