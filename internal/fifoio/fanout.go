package fifoio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// SinkPipeSize is what a sink FIFO's buffer is raised to (best effort): the sink is
// dropped when its reader falls this far behind.
const SinkPipeSize = 1 << 20

// Fanout is the destination of one output stream of a process: the primary writer
// (the CRI log, the caller's FIFO or nothing) gets everything, and attach sinks get a
// copy as long as they keep up. A sink never blocks the stream: a write that does not fit
// into its FIFO at once, or fails, drops the sink.
type Fanout struct {
	w io.Writer

	mu     sync.Mutex
	sinks  []*Sink
	closed bool
}

// NewFanout returns a Fanout whose primary writer is w.
func NewFanout(w io.Writer) *Fanout { return &Fanout{w: w} }

func (f *Fanout) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	var dropped []*Sink
	f.mu.Lock()
	kept := f.sinks[:0]
	for _, s := range f.sinks {
		if s.write(p) {
			kept = append(kept, s)
		} else {
			dropped = append(dropped, s)
		}
	}
	clear(f.sinks[len(kept):])
	f.sinks = kept
	f.mu.Unlock()
	for _, s := range dropped {
		s.Close()
	}
	return n, err
}

// Add registers s; false once the stream has ended.
func (f *Fanout) Add(s *Sink) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.sinks = append(f.sinks, s)
	return true
}

// Remove drops s and closes it: its session ended.
func (f *Fanout) Remove(s *Sink) {
	f.mu.Lock()
	if i := slices.Index(f.sinks, s); i >= 0 {
		f.sinks = slices.Delete(f.sinks, i, i+1)
	}
	f.mu.Unlock()
	s.Close()
}

// Close drops every sink: the stream has ended.
func (f *Fanout) Close() {
	f.mu.Lock()
	f.closed = true
	sinks := f.sinks
	f.sinks = nil
	f.mu.Unlock()
	for _, s := range sinks {
		s.Close()
	}
}

// Sink is an attach session's output FIFO (a non-blocking write end).
type Sink struct {
	f    *os.File
	rc   syscall.RawConn
	once sync.Once
}

// OpenSink opens the FIFO for writing; its reader must be open already.
func OpenSink(path string) (*Sink, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENXIO) {
			return nil, fmt.Errorf("open %s: no reader on the FIFO", path)
		}
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	_ = rc.Control(func(fd uintptr) {
		_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, SinkPipeSize)
	})
	return &Sink{f: f, rc: rc}, nil
}

// write writes all of p without waiting; false if it could not.
func (s *Sink) write(p []byte) bool {
	ok := false
	err := s.rc.Control(func(fd uintptr) {
		for len(p) > 0 {
			n, err := unix.Write(int(fd), p)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				return
			}
			p = p[n:]
		}
		ok = true
	})
	return err == nil && ok
}

// Watch returns once the reader has closed the FIFO or the sink is closed. It waits in
// the runtime poller: an idle session costs a parked goroutine, no thread.
func (s *Sink) Watch() {
	_ = s.rc.Write(func(fd uintptr) bool {
		// POLLERR and POLLHUP are reported whatever is asked for.
		pfd := []unix.PollFd{{Fd: int32(fd)}}
		n, err := unix.Poll(pfd, 0)
		if err != nil {
			return err != unix.EINTR
		}
		return n > 0 && pfd[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0
	})
}

// Close closes the FIFO; it is safe to call more than once.
func (s *Sink) Close() {
	s.once.Do(func() { _ = s.f.Close() })
}

// Len is the number of sinks attached.
func (f *Fanout) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sinks)
}
