package task

import (
	"errors"
	"fmt"
	"github.com/crisp-runtime/crisp/fifoio"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/crisp-runtime/crisp/shim/crilog"
	"golang.org/x/sys/unix"
)

const (
	streamStdout = crilog.Stdout
	streamStderr = crilog.Stderr
)

// Errors of stdio.attach, mapped to status codes by the service.
var (
	errAttachClosed   = errors.New("the process's streams are closed")
	errAttachNoStdin  = errors.New("the process has no stdin")
	errAttachNoOutput = errors.New("the process's output is not copied by the shim (it goes to the caller's FIFOs)")
)

// attachPipeSize is what an attach FIFO's buffer is raised to (best effort): the sink is
// dropped when its reader falls this far behind.
const attachPipeSize = 1 << 20

// fanout is the destination of one output stream the shim copies: the primary writer
// (the CRI log, the caller's FIFO or nothing) gets everything, and attach sinks get a
// copy as long as they keep up. A sink never blocks the stream: a write that does not fit
// into its FIFO at once, or fails, drops the sink.
type fanout struct {
	w io.Writer

	mu     sync.Mutex
	sinks  []*sink
	closed bool
}

func newFanout(w io.Writer) *fanout { return &fanout{w: w} }

func (f *fanout) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	var dropped []*sink
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
		s.close()
	}
	return n, err
}

// add registers s; false once the stream has ended.
func (f *fanout) add(s *sink) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.sinks = append(f.sinks, s)
	return true
}

func (f *fanout) remove(s *sink) {
	f.mu.Lock()
	if i := slices.Index(f.sinks, s); i >= 0 {
		f.sinks = slices.Delete(f.sinks, i, i+1)
	}
	f.mu.Unlock()
	s.close()
}

// close drops every sink: the stream has ended.
func (f *fanout) close() {
	f.mu.Lock()
	f.closed = true
	sinks := f.sinks
	f.sinks = nil
	f.mu.Unlock()
	for _, s := range sinks {
		s.close()
	}
}

// sink is an attach session's output FIFO (the shim's non-blocking write end).
type sink struct {
	f    *os.File
	rc   syscall.RawConn
	once sync.Once
}

// openSink opens the FIFO for writing; its reader must be open already.
func openSink(path string) (*sink, error) {
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
		_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, attachPipeSize)
	})
	return &sink{f: f, rc: rc}, nil
}

// write writes all of p without waiting; false if it could not.
func (s *sink) write(p []byte) bool {
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

// watch returns once the reader has closed the FIFO or the sink is closed. It waits in
// the runtime poller: an idle session costs a parked goroutine, no thread.
func (s *sink) watch() {
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

func (s *sink) close() {
	s.once.Do(func() { _ = s.f.Close() })
}

// attachIn copies an attach session's stdin FIFO into the process's stdin.
type attachIn struct {
	src  *os.File
	once sync.Once
	// done is closed by stdio.dropAttachIn once the copy is over (or never started).
	done chan struct{}
}

func newAttachIn(src *os.File) *attachIn {
	return &attachIn{src: src, done: make(chan struct{})}
}

func (a *attachIn) close() {
	a.once.Do(func() { _ = a.src.Close() })
}

// hungUp reports whether every writer of the FIFO is gone: the copy will end by itself
// once it has copied what is left. A closed FIFO counts as hung up.
func (a *attachIn) hungUp() bool {
	rc, err := a.src.SyscallConn()
	if err != nil {
		return true
	}
	hup := true
	if err := rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd)}}
		n, err := unix.Poll(pfd, 0)
		hup = err == nil && n > 0 && pfd[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
	}); err != nil {
		return true
	}
	return hup
}

// attach connects an attach session's FIFOs ("" = none) to the process. Output sinks
// live until their reader closes them or the stream ends; stdin is copied until its
// writers are gone or the process's streams are closed.
func (s *stdio) attach(stdinPath, stdoutPath, stderrPath string) (retErr error) {
	s.attachMu.Lock()
	closed := s.attachClosed
	s.attachMu.Unlock()
	if closed {
		return errAttachClosed
	}
	type target struct {
		fan  *fanout
		path string
	}
	var targets []target
	if s.terminal {
		// A terminal's combined output goes to stdout; stderr stays unconnected.
		if stdoutPath != "" {
			targets = append(targets, target{s.fans[streamStdout], stdoutPath})
		}
	} else {
		for _, t := range []target{{s.fans[streamStdout], stdoutPath}, {s.fans[streamStderr], stderrPath}} {
			if t.path != "" {
				targets = append(targets, t)
			}
		}
	}
	for _, t := range targets {
		if t.fan == nil {
			return errAttachNoOutput
		}
	}
	if stdinPath != "" && s.inDst == nil {
		return errAttachNoStdin
	}

	// Open everything first, so a failure leaves nothing behind.
	sinks := make([]*sink, 0, len(targets))
	var in *attachIn
	defer func() {
		if retErr != nil {
			for _, sk := range sinks {
				sk.close()
			}
			if in != nil {
				in.close()
			}
		}
	}()
	for _, t := range targets {
		sk, err := openSink(t.path)
		if err != nil {
			return err
		}
		sinks = append(sinks, sk)
	}
	if stdinPath != "" {
		src, err := os.OpenFile(stdinPath, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open stdin fifo: %w", err)
		}
		in = newAttachIn(src)
	}

	s.attachMu.Lock()
	if s.attachClosed {
		s.attachMu.Unlock()
		return errAttachClosed
	}
	if in != nil {
		s.attachIns[in] = struct{}{}
	}
	s.attachMu.Unlock()
	for i, t := range targets {
		if !t.fan.add(sinks[i]) {
			// The stream ended meanwhile: the process is gone.
			for _, sk := range sinks[i:] {
				sk.close()
			}
			sinks = nil
			if in != nil {
				s.dropAttachIn(in)
				in = nil
			}
			return errAttachClosed
		}
	}
	for i, t := range targets {
		sk, fan := sinks[i], t.fan
		go func() {
			sk.watch()
			fan.remove(sk)
		}()
	}
	if in != nil {
		dst := s.inDst
		go func() {
			if err := fifoio.CopyFIFOIn(dst, in.src); err != nil && !errors.Is(err, os.ErrClosed) && !errors.Is(err, unix.EPIPE) {
				s.log.Debug("copy attach stdin", "error", err)
			}
			s.dropAttachIn(in)
		}()
	}
	return nil
}

// dropAttachIn ends in; it runs once per session, when its copy is over or when the
// attach failed before the copy started.
func (s *stdio) dropAttachIn(in *attachIn) {
	s.attachMu.Lock()
	delete(s.attachIns, in)
	s.attachMu.Unlock()
	in.close()
	close(in.done)
}

// finishEndedAttachIns waits up to timeout for the stdin copies of the sessions whose
// clients are gone to copy what they left in their FIFOs. A client with stdin_once
// closes its FIFO and then calls CloseIO at once: without the wait the process's stdin
// could close before the client's last bytes reached it. Sessions still writing are
// not waited for.
func (s *stdio) finishEndedAttachIns(timeout time.Duration) {
	s.attachMu.Lock()
	var ended []*attachIn
	for in := range s.attachIns {
		if in.hungUp() {
			ended = append(ended, in)
		}
	}
	s.attachMu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	for _, in := range ended {
		select {
		case <-in.done:
		case <-t.C:
			s.log.Warn("attach stdin copy did not finish before the stdin was closed")
			return
		}
	}
}

// detachAll ends the attach sessions' stdin copies and refuses new sessions; the output
// sinks end with their streams.
func (s *stdio) detachAll() {
	s.attachMu.Lock()
	s.attachClosed = true
	ins := make([]*attachIn, 0, len(s.attachIns))
	for in := range s.attachIns {
		ins = append(ins, in)
	}
	s.attachMu.Unlock()
	for _, in := range ins {
		in.close()
	}
}
