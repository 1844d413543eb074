package task

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/crilog"
	"github.com/crisp-runtime/crisp/internal/fifoio"
)

// ioConfig says where a process's stdio goes.
type ioConfig struct {
	terminal bool
	// stdin, stdout and stderr are FIFOs the caller created ("" = none).
	stdin, stdout, stderr string
	// stdinMarker, for a container's init, makes a stdin that is not a FIFO a request
	// for a stdin the shim keeps open for attach sessions (a pipe, or the pty).
	stdinMarker bool
	// log, when set, receives stdout and stderr (the terminal as stdout) in the CRI log
	// format instead of the stdout and stderr FIFOs.
	log *crilog.Writer
	// attachable, for a container's init, gives a stream with neither a log nor a FIFO
	// a pipe the shim drains and discards, as containerd's CRI does, instead of
	// /dev/null: attach sessions can then join it. Exec processes have no attach, so
	// theirs stay /dev/null and their exit never waits on such a pipe.
	attachable bool
}

// stdio is the shim's side of a process's standard streams.
type stdio struct {
	log *slog.Logger

	// childFiles are the process's ends (pipe ends, FIFOs handed over directly, the
	// console socket); the shim closes its copies once the process has started.
	childFiles []*os.File
	// consoleSock is the shim's end of the console socket until the pty master arrives.
	consoleSock int
	// termOut receives the terminal's output; nil drains it.
	termOut     io.Writer
	termOutDone func()

	console *os.File // pty master, nil without a terminal
	stdin   *stdinCopier
	outputs []output
	// owned are closed by close: output sources, the console, FIFOs the shim writes.
	owned []*os.File

	terminal bool
	// fans are the streams' destinations that attach sessions join (by crilog stream
	// name; a terminal has only stdout), absent where the process writes the caller's
	// FIFO itself.
	fans map[string]*fifoio.Fanout
	// inPipe is the write end of the process's stdin pipe that the shim keeps when the
	// stdin given is not a FIFO: attach sessions write to it.
	inPipe *os.File
	// wantStdin says a terminal's stdin was asked for: attach sessions write to the pty.
	wantStdin bool
	// inDst is where attach sessions' stdin goes (nil: the process has no stdin).
	inDst *os.File

	attachMu     sync.Mutex
	attachClosed bool
	attachIns    map[*attachIn]struct{}

	running atomic.Int32
	drained chan struct{} // closed once every output copier has returned
	once    sync.Once
}

// output is one stream the shim copies: from the process's pipe or pty to dst.
type output struct {
	src  *os.File
	dst  io.Writer
	done func() // runs when the copy ends (flushes a log stream)
}

// childStdio are the process's ends of its stdio and its console socket: the shim
// passes them to the task helper, which gives them to libcontainer (nil: none).
type childStdio struct {
	Stdin, Stdout, Stderr, ConsoleSocket *os.File
}

// openStdio prepares the stdio of a process before it is started and sets lp to the
// process's ends. On error nothing stays open.
func openStdio(cfg ioConfig, lp *childStdio, log *slog.Logger) (_ *stdio, retErr error) {
	s := &stdio{
		log:         log,
		consoleSock: -1,
		drained:     make(chan struct{}),
		terminal:    cfg.terminal,
		fans:        map[string]*fifoio.Fanout{},
		attachIns:   map[*attachIn]struct{}{},
	}
	defer func() {
		if retErr != nil {
			s.abort()
		}
	}()
	if cfg.terminal {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("console socket: %w", err)
		}
		s.consoleSock = fds[0]
		child := os.NewFile(uintptr(fds[1]), "console-socket")
		s.childFiles = append(s.childFiles, child)
		lp.ConsoleSocket = child
		switch {
		case cfg.log != nil:
			sink, st := crilog.NewSink(cfg.log, crilog.Stdout, log)
			s.termOut, s.termOutDone = sink, func() { _ = st.Close() }
		case cfg.stdout != "":
			f, err := os.OpenFile(cfg.stdout, os.O_RDWR, 0)
			if err != nil {
				return nil, fmt.Errorf("open stdout fifo: %w", err)
			}
			s.owned = append(s.owned, f)
			s.termOut = f
		}
		// Nobody may read the terminal, but an unread pty fills up and blocks the
		// process, so it is drained.
		base := s.termOut
		if base == nil {
			base = io.Discard
		}
		fan := fifoio.NewFanout(base)
		s.fans[streamStdout] = fan
		prevDone := s.termOutDone
		s.termOut, s.termOutDone = fan, func() {
			fan.Close()
			if prevDone != nil {
				prevDone()
			}
		}
		if cfg.stdin != "" {
			if cfg.stdinMarker && !isFIFO(cfg.stdin) {
				// Only a marker: attach sessions write to the pty master.
				s.wantStdin = true
				return s, nil
			}
			c, err := openStdinCopier(cfg.stdin)
			if err != nil {
				return nil, err
			}
			s.stdin = c // its dst, the pty master, arrives after the start
		}
		return s, nil
	}

	if cfg.stdin != "" && cfg.stdinMarker && !isFIFO(cfg.stdin) {
		// A marker, not a FIFO: the process gets a pipe whose write end the shim
		// keeps open for attach sessions; CloseIO closes it.
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
		s.childFiles = append(s.childFiles, r)
		s.owned = append(s.owned, w)
		lp.Stdin = r
		s.inPipe, s.inDst = w, w
	} else if cfg.stdin != "" {
		c, err := openStdinCopier(cfg.stdin)
		if err != nil {
			return nil, err
		}
		s.stdin = c
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
		s.childFiles = append(s.childFiles, r)
		lp.Stdin = r
		// The copier owns the write end: closing it is how the process sees EOF.
		c.dst = w
		s.inDst = w
	}
	var direct map[string]*os.File
	for _, o := range []struct {
		name, path string
		set        func(*os.File)
	}{
		{crilog.Stdout, cfg.stdout, func(f *os.File) { lp.Stdout = f }},
		{crilog.Stderr, cfg.stderr, func(f *os.File) { lp.Stderr = f }},
	} {
		switch {
		case cfg.log != nil:
			r, err := s.outputPipe(o.name, o.set)
			if err != nil {
				return nil, err
			}
			sink, st := crilog.NewSink(cfg.log, o.name, log)
			s.fanOutput(o.name, r, sink, func() { _ = st.Close() })
		case o.path == "" && cfg.attachable:
			// Nobody reads this output unless an attach session joins, but an unread
			// pipe fills up and blocks the process, so it is drained.
			r, err := s.outputPipe(o.name, o.set)
			if err != nil {
				return nil, err
			}
			s.fanOutput(o.name, r, io.Discard, nil)
		case o.path != "":
			// The FIFO itself becomes the process's stdout: no copy, no goroutine,
			// no buffer in the shim. O_RDWR never blocks and keeps a reader, so an
			// early write does not fail before the caller opened its end (containerd's
			// shim keeps a reader open for the same reason).
			f := direct[o.path]
			if f == nil {
				fd, err := unix.Open(o.path, unix.O_RDWR|unix.O_CLOEXEC, 0)
				if err != nil {
					return nil, fmt.Errorf("open %s fifo %s: %w", o.name, o.path, err)
				}
				f = os.NewFile(uintptr(fd), o.path)
				s.childFiles = append(s.childFiles, f)
				if direct == nil {
					direct = map[string]*os.File{}
				}
				direct[o.path] = f
			}
			o.set(f)
		}
	}
	return s, nil
}

// outputPipe gives the process a pipe as its stream name (set installs the write end)
// and returns the read end, which s owns.
func (s *stdio) outputPipe(name string, set func(*os.File)) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%s pipe: %w", name, err)
	}
	s.childFiles = append(s.childFiles, w)
	s.owned = append(s.owned, r)
	set(w)
	return r, nil
}

// fanOutput has the stream name copied from src to dst through a fanout that attach
// sessions join; done, if set, runs after the fanout closed, when the copy ends.
func (s *stdio) fanOutput(name string, src *os.File, dst io.Writer, done func()) {
	fan := fifoio.NewFanout(dst)
	s.fans[name] = fan
	s.outputs = append(s.outputs, output{src: src, dst: fan, done: func() {
		fan.Close()
		if done != nil {
			done()
		}
	}})
}

// started finishes the setup once the process runs: the shim's copies of the process's
// ends are closed, the pty master is received, and the copiers start.
func (s *stdio) started() error {
	for _, f := range s.childFiles {
		_ = f.Close()
	}
	s.childFiles = nil
	if s.consoleSock >= 0 {
		master, err := recvConsole(s.consoleSock)
		_ = unix.Close(s.consoleSock)
		s.consoleSock = -1
		if err != nil {
			close(s.drained) // no copier will run
			return err
		}
		s.console = master
		s.owned = append(s.owned, master)
		s.outputs = append(s.outputs, output{src: master, dst: s.termOut, done: s.termOutDone})
		if s.stdin != nil {
			s.stdin.dst = master
		}
		if s.stdin != nil || s.wantStdin {
			s.inDst = master
		}
	}
	s.running.Store(int32(len(s.outputs)))
	if len(s.outputs) == 0 {
		close(s.drained)
	}
	for _, o := range s.outputs {
		go s.copyOutput(o)
	}
	if s.stdin != nil {
		s.stdin.start()
	}
	return nil
}

func (s *stdio) copyOutput(o output) {
	if err := fifoio.CopyFile(o.dst, o.src); err != nil && !errors.Is(err, os.ErrClosed) {
		s.log.Warn("copy process output", "error", err)
	}
	if o.done != nil {
		o.done()
	}
	if s.running.Add(-1) == 0 {
		close(s.drained)
	}
}

// drain waits up to timeout for the outputs to reach EOF (every writer, the process and
// anything it left behind, has closed them) and reports whether they did.
func (s *stdio) drain(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-s.drained:
		return true
	case <-t.C:
		return false
	}
}

// closeStdin closes the process's stdin (CloseIO).
func (s *stdio) closeStdin() {
	if s.stdin != nil {
		s.stdin.closeInput()
	}
	if s.inPipe != nil {
		s.finishEndedAttachIns(attachStdinFinish)
		_ = s.inPipe.Close()
	}
}

// attachStdinFinish bounds how long CloseIO waits for ended attach sessions' stdin to
// be copied into the process (which may not be reading it).
const attachStdinFinish = 2 * time.Second

// resize sets the terminal size.
func (s *stdio) resize(width, height uint32) error {
	if s.console == nil {
		return errNoTerminal
	}
	rc, err := s.console.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(height), Col: uint16(width)})
	}); err != nil {
		return err
	}
	return ierr
}

var errNoTerminal = errors.New("the process has no terminal")

// close releases everything: copiers stop, files close. Output not read by now is lost.
func (s *stdio) close() {
	s.once.Do(func() {
		s.detachAll()
		for _, f := range s.owned {
			_ = f.Close()
		}
		if s.stdin != nil {
			s.stdin.stop(s.log)
		}
		if !s.drain(2 * time.Second) {
			s.log.Warn("output copiers still running after close")
		}
	})
}

// abort undoes openStdio when the process never started.
func (s *stdio) abort() {
	for _, f := range s.childFiles {
		_ = f.Close()
	}
	s.childFiles = nil
	if s.consoleSock >= 0 {
		_ = unix.Close(s.consoleSock)
		s.consoleSock = -1
	}
	for _, f := range s.owned {
		_ = f.Close()
	}
	if s.stdin != nil {
		s.stdin.stop(s.log)
	}
	if s.termOutDone != nil {
		s.termOutDone()
	}
	for _, o := range s.outputs {
		if o.done != nil {
			o.done()
		}
	}
}

// recvConsole receives the pty master that libcontainer's init sends over the console
// socket (runc's recvtty does the same); the init has sent it before Start returned.
func recvConsole(sock int) (*os.File, error) {
	var name [256]byte
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(sock, name[:], oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("receive console: %w", err)
	}
	if n == 0 && oobn == 0 {
		return nil, errors.New("receive console: the process closed the console socket without sending one")
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("receive console: bad control message (%d messages): %v", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) == 0 {
		return nil, fmt.Errorf("receive console: no file descriptor: %v", err)
	}
	for _, fd := range fds[1:] {
		_ = unix.Close(fd)
	}
	fd := fds[0]
	// Without this the pty turns every "\n" into "\r\n" (runc's recvtty clears it too).
	if t, err := unix.IoctlGetTermios(fd, unix.TCGETS); err == nil {
		t.Oflag &^= unix.ONLCR
		_ = unix.IoctlSetTermios(fd, unix.TCSETS, t)
	}
	// Non-blocking, so os.File reads it through the runtime poller: an idle terminal
	// costs no thread, and Close interrupts a pending read.
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("console: %w", err)
	}
	return os.NewFile(uintptr(fd), string(name[:n])), nil
}

// stdinCopier copies a stdin FIFO into the process's stdin (a pipe or the pty master).
type stdinCopier struct {
	src *os.File // the FIFO's read end
	// keep is the shim's own writer on the FIFO, as containerd's shim holds one: while
	// it is open the copy never sees EOF, neither before the caller has connected nor
	// between two of its connections. CloseIO closes it; the process then gets EOF
	// once the caller's writers are gone and what they wrote is copied.
	keep *os.File
	dst  *os.File
	// closeDst closes dst at EOF: a pipe gives the process EOF; a pty master hangs
	// the terminal up, which is what containerd does when a terminal's stdin ends.
	closeDst bool

	keepOnce sync.Once
	mu       sync.Mutex
	started  bool
	done     chan struct{}
}

// openStdinCopier opens the FIFO at path; neither open blocks.
func openStdinCopier(path string) (*stdinCopier, error) {
	src, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open stdin fifo: %w", err)
	}
	// Succeeds without waiting: the FIFO has a reader now.
	keep, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		_ = src.Close()
		return nil, fmt.Errorf("open stdin fifo for writing: %w", err)
	}
	return &stdinCopier{src: src, keep: keep, closeDst: true, done: make(chan struct{})}, nil
}

func (c *stdinCopier) start() {
	c.mu.Lock()
	c.started = true
	c.mu.Unlock()
	go func() {
		defer close(c.done)
		_ = fifoio.CopyFile(c.dst, c.src)
		_ = c.src.Close()
		if c.closeDst {
			_ = c.dst.Close()
		}
	}()
}

// closeInput drops the shim's writer (CloseIO): the process reads EOF after the data
// the caller wrote.
func (c *stdinCopier) closeInput() {
	c.keepOnce.Do(func() { _ = c.keep.Close() })
}

// stop ends the copy at once (the process is gone or being deleted).
func (c *stdinCopier) stop(log *slog.Logger) {
	c.closeInput()
	_ = c.src.Close()
	if c.closeDst && c.dst != nil {
		// Also releases a copier blocked writing to a process that does not read.
		_ = c.dst.Close()
	}
	c.mu.Lock()
	started := c.started
	c.mu.Unlock()
	if !started {
		return
	}
	select {
	case <-c.done:
	case <-time.After(2 * time.Second):
		log.Warn("stdin copier did not stop")
	}
}

// isFIFO reports whether path is a FIFO; anything else as a stdin is only a marker.
func isFIFO(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeNamedPipe != 0
}
