package task

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func testFIFO(t *testing.T) (path string, r *os.File) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return path, r
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

func sinkCount(f *fanout) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sinks)
}

// TestFanoutDropsSlowSink: a sink whose reader does not keep up is dropped without
// blocking the stream, and the primary writer gets everything.
func TestFanoutDropsSlowSink(t *testing.T) {
	var primary bytes.Buffer
	f := newFanout(&primary)
	slowPath, slowR := testFIFO(t)
	fastPath, fastR := testFIFO(t)
	slow, err := openSink(slowPath)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := openSink(fastPath)
	if err != nil {
		t.Fatal(err)
	}
	f.add(slow)
	f.add(fast)
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	var fastGot int
	buf := make([]byte, 128<<10)
	for range 2 * attachPipeSize / len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
		fastGot += drainFIFO(fastR, buf)
	}
	if want := 2 * attachPipeSize; primary.Len() != want || fastGot != want {
		t.Errorf("primary got %d, fast sink %d; want %d", primary.Len(), fastGot, want)
	}
	if n := sinkCount(f); n != 1 {
		t.Errorf("%d sinks left, want the fast one", n)
	}
	// The slow reader sees what fit, then EOF.
	slowGot := drainFIFO(slowR, buf)
	if slowGot == 0 || slowGot >= 2*attachPipeSize {
		t.Errorf("slow reader got %d bytes", slowGot)
	}
	f.close()
	if n := sinkCount(f); n != 0 {
		t.Errorf("%d sinks after close", n)
	}
	if f.add(fast) {
		t.Error("add after close succeeded")
	}
}

// TestSinkWatch: watch returns once the reader is gone, and at close.
func TestSinkWatch(t *testing.T) {
	path, r := testFIFO(t)
	s, err := openSink(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.watch(); close(done) }()
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
	s.close()

	path2, _ := testFIFO(t)
	s2, err := openSink(path2)
	if err != nil {
		t.Fatal(err)
	}
	done2 := make(chan struct{})
	go func() { s2.watch(); close(done2) }()
	time.Sleep(50 * time.Millisecond)
	s2.close()
	select {
	case <-done2:
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not end at close")
	}
	if _, err := openSink(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("openSink of a missing FIFO succeeded")
	}
}
