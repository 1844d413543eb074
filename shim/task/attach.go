package task

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/crilog"
	"github.com/crisp-runtime/crisp/internal/fifoio"
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
		fan  *fifoio.Fanout
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
	sinks := make([]*fifoio.Sink, 0, len(targets))
	var in *attachIn
	defer func() {
		if retErr != nil {
			for _, sk := range sinks {
				sk.Close()
			}
			if in != nil {
				in.close()
			}
		}
	}()
	for _, t := range targets {
		sk, err := fifoio.OpenSink(t.path)
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
		if !t.fan.Add(sinks[i]) {
			// The stream ended meanwhile: the process is gone.
			for _, sk := range sinks[i:] {
				sk.Close()
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
			sk.Watch()
			fan.Remove(sk)
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
