package fifoio

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fifo makes a FIFO and opens its read end without blocking.
func fifo(t *testing.T, name string) (string, *os.File) {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return p, f
}

// drainFIFO reads what r holds without waiting.
func drainFIFO(r *os.File, buf []byte) int {
	total := 0
	rc, err := r.SyscallConn()
	if err != nil {
		return 0
	}
	_ = rc.Control(func(fd uintptr) {
		for {
			n, err := unix.Read(int(fd), buf)
			if err != nil || n <= 0 {
				return
			}
			total += n
		}
	})
	return total
}

// TestFanoutDropsSlowSink: a sink whose reader does not keep up is dropped without
// blocking the stream, and the primary writer gets everything.
func TestFanoutDropsSlowSink(t *testing.T) {
	var primary bytes.Buffer
	f := NewFanout(&primary)
	slowPath, slowR := fifo(t, "f")
	fastPath, fastR := fifo(t, "f")
	slow, err := OpenSink(slowPath)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := OpenSink(fastPath)
	if err != nil {
		t.Fatal(err)
	}
	f.Add(slow)
	f.Add(fast)
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	var fastGot int
	buf := make([]byte, 128<<10)
	for range 2 * SinkPipeSize / len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
		fastGot += drainFIFO(fastR, buf)
	}
	if want := 2 * SinkPipeSize; primary.Len() != want || fastGot != want {
		t.Errorf("primary got %d, fast sink %d; want %d", primary.Len(), fastGot, want)
	}
	if n := f.Len(); n != 1 {
		t.Errorf("%d sinks left, want the fast one", n)
	}
	// The slow reader sees what fit, then EOF.
	slowGot := drainFIFO(slowR, buf)
	if slowGot == 0 || slowGot >= 2*SinkPipeSize {
		t.Errorf("slow reader got %d bytes", slowGot)
	}
	f.Close()
	if n := f.Len(); n != 0 {
		t.Errorf("%d sinks after close", n)
	}
	if f.Add(fast) {
		t.Error("add after close succeeded")
	}
}

// TestSinkWatch: watch returns once the reader is gone, and at close.
func TestSinkWatch(t *testing.T) {
	path, r := fifo(t, "f")
	s, err := OpenSink(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.Watch(); close(done) }()
	select {
	case <-done:
		t.Fatal("watch returned while the reader is open")
	case <-time.After(100 * time.Millisecond):
	}
	r.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not notice the reader closing")
	}
	s.Close()

	path2, _ := fifo(t, "f")
	s2, err := OpenSink(path2)
	if err != nil {
		t.Fatal(err)
	}
	done2 := make(chan struct{})
	go func() { s2.Watch(); close(done2) }()
	time.Sleep(50 * time.Millisecond)
	s2.Close()
	select {
	case <-done2:
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not end at close")
	}
	if _, err := OpenSink(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("openSink of a missing FIFO succeeded")
	}
}
