package fifoio

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Errors of Attach.Attach; each caller says them in its own words.
var (
	// ErrAttachClosed: the process's streams have ended (it exited or is deleted).
	ErrAttachClosed = errors.New("the process's streams are closed")
	// ErrNoStdin: the process has no stdin attach sessions may write to.
	ErrNoStdin = errors.New("the process has no stdin")
	// ErrNoOutput: a requested output stream does not pass through a Fanout.
	ErrNoOutput = errors.New("the process's output stream has no fanout")
)

// Attach connects attach sessions to one process: their output FIFOs join its streams'
// Fanouts, and their stdin FIFOs are copied into its stdin. The shim uses it for its
// containers, criserver for the containers of task-only shims, whose output it copies.
type Attach struct {
	stdout, stderr *Fanout
	// terminal: a terminal's output is one stream, stdout; a session's stderr FIFO is
	// left unconnected.
	terminal bool
	log      *slog.Logger

	mu     sync.Mutex
	stdin  io.Writer // nil: no stdin
	closed bool
	ins    map[*stdinSession]struct{}
}

// NewAttach returns the attach side of a process whose output goes through stdout
// and stderr (nil: not copied by the caller); its stdin comes with SetStdin.
func NewAttach(stdout, stderr *Fanout, terminal bool, log *slog.Logger) *Attach {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Attach{stdout: stdout, stderr: stderr, terminal: terminal, log: log, ins: map[*stdinSession]struct{}{}}
}

// SetStdin sets where sessions' stdin goes; nil refuses stdin to new sessions. A pty
// master arrives only once the process runs; a stdin closed by CloseIO goes.
func (a *Attach) SetStdin(w io.Writer) {
	a.mu.Lock()
	a.stdin = w
	a.mu.Unlock()
}

// stdinSession copies one session's stdin FIFO into the process's stdin.
type stdinSession struct {
	src  *os.File
	once sync.Once
	// done is closed once the copy is over (or never started).
	done chan struct{}
}

func (in *stdinSession) close() {
	in.once.Do(func() { _ = in.src.Close() })
}

// hungUp reports whether every writer of the FIFO is gone: the copy ends by itself
// once it has copied what is left. A closed FIFO counts as hung up.
func (in *stdinSession) hungUp() bool {
	rc, err := in.src.SyscallConn()
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

// outputTarget is one output FIFO of a session and the stream it joins.
type outputTarget struct {
	fan  *Fanout
	path string
}

// targets lists the output FIFOs a session asks for ("" = none) with their streams.
func (a *Attach) targets(stdoutPath, stderrPath string) ([]outputTarget, error) {
	var ts []outputTarget
	if stdoutPath != "" {
		ts = append(ts, outputTarget{a.stdout, stdoutPath})
	}
	if stderrPath != "" && !a.terminal {
		ts = append(ts, outputTarget{a.stderr, stderrPath})
	}
	for _, t := range ts {
		if t.fan == nil {
			return nil, ErrNoOutput
		}
	}
	return ts, nil
}

// Attach connects a session's FIFOs ("" = none). Output sinks live until their reader
// closes them or the stream ends, and a sink that falls behind is dropped without
// slowing the stream (see Fanout); stdin is copied until the FIFO's writers are gone or
// Close. Everything is opened first, so a failure leaves nothing behind.
func (a *Attach) Attach(stdinPath, stdoutPath, stderrPath string) (retErr error) {
	a.mu.Lock()
	closed, dst := a.closed, a.stdin
	a.mu.Unlock()
	if closed {
		return ErrAttachClosed
	}
	targets, err := a.targets(stdoutPath, stderrPath)
	if err != nil {
		return err
	}
	if stdinPath != "" && dst == nil {
		return ErrNoStdin
	}
	sinks := make([]*Sink, 0, len(targets))
	var in *stdinSession
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
		sk, err := OpenSink(t.path)
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
		in = &stdinSession{src: src, done: make(chan struct{})}
	}
	if err := a.join(targets, sinks, in); err != nil {
		return err
	}
	for i, t := range targets {
		sk, fan := sinks[i], t.fan
		go func() {
			sk.Watch()
			fan.Remove(sk)
		}()
	}
	if in != nil {
		go a.copyStdin(dst, in)
	}
	return nil
}

// join registers the session's stdin and adds its sinks to their streams; on failure
// (the process ended meanwhile) nothing of it stays registered.
func (a *Attach) join(targets []outputTarget, sinks []*Sink, in *stdinSession) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return ErrAttachClosed
	}
	if in != nil {
		a.ins[in] = struct{}{}
	}
	a.mu.Unlock()
	for i, t := range targets {
		if t.fan.Add(sinks[i]) {
			continue
		}
		for j := range i {
			targets[j].fan.Remove(sinks[j])
		}
		if in != nil {
			a.dropStdin(in)
		}
		return ErrAttachClosed
	}
	return nil
}

func (a *Attach) copyStdin(dst io.Writer, in *stdinSession) {
	if err := CopyFIFOIn(dst, in.src); err != nil && !errors.Is(err, os.ErrClosed) && !errors.Is(err, unix.EPIPE) {
		a.log.Debug("copy attach stdin", "error", err)
	}
	a.dropStdin(in)
}

// dropStdin ends a session's stdin copy; it runs once per session, when its copy is
// over or when the attach failed before the copy started.
func (a *Attach) dropStdin(in *stdinSession) {
	a.mu.Lock()
	delete(a.ins, in)
	a.mu.Unlock()
	in.close()
	close(in.done)
}

// WaitStdin waits up to timeout for sessions' stdin copies to finish and reports
// whether they did: with endedOnly, only those of sessions whose clients are gone,
// which finish once they have copied what the clients left in their FIFOs; else all.
// A client with stdin_once closes its FIFO and then closes the process's stdin at
// once: without the wait its last bytes could miss the process.
func (a *Attach) WaitStdin(timeout time.Duration, endedOnly bool) bool {
	a.mu.Lock()
	var wait []*stdinSession
	for in := range a.ins {
		if !endedOnly || in.hungUp() {
			wait = append(wait, in)
		}
	}
	a.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	for _, in := range wait {
		select {
		case <-in.done:
		case <-t.C:
			return false
		}
	}
	return true
}

// Close refuses new sessions and ends the stdin copies; the output sinks end with
// their streams (Fanout.Close).
func (a *Attach) Close() {
	a.mu.Lock()
	a.closed = true
	ins := make([]*stdinSession, 0, len(a.ins))
	for in := range a.ins {
		ins = append(ins, in)
	}
	a.mu.Unlock()
	for _, in := range ins {
		in.close()
	}
}
