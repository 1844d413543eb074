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
	// labelled says the process runs with an SELinux label of its own: its stdout and
	// stderr are then pipes the shim copies to the caller's FIFOs, as containerd's
	// shim does, never the FIFOs themselves. A FIFO carries the label of the state
	// directory it was made in (container_runtime_t), which the policy keeps the
	// container's domain from reading or writing; a pipe the shim makes carries the
	// shim's, which the container policies let their domains use.
	labelled bool
}

// stdio is the shim's side of a process's standard streams. What differs between a
// process with a terminal and one with pipes is chosen once, by openStdio, as its kind;
// the rest (copies, drain, attach sessions, close ordering) is shared.
type stdio struct {
	log *slog.Logger
	// kind is the terminal or the pipes.
	kind stdioKind

	// childFiles are the process's ends (pipe ends, FIFOs handed over directly, the
	// console socket); the shim closes its copies once the process has started.
	childFiles []*os.File
	stdin      *stdinCopier
	outputs    []output
	// owned are closed by close: output sources, the console, FIFOs the shim writes.
	owned []*os.File

	// fans are the streams' destinations that attach sessions join (by crilog stream
	// name; a terminal has only stdout), absent where the process writes the caller's
	// FIFO itself.
	fans map[string]*fifoio.Fanout
	// sessions are the attach sessions; their stdin goes where the kind says.
	sessions *fifoio.Attach
	// inPipe is the write end of the process's stdin pipe that the shim keeps when the
	// stdin given is not a FIFO: attach sessions write to it.
	inPipe *os.File

	running atomic.Int32
	drained chan struct{} // closed once every output copier has returned
	once    sync.Once
}

// stdioKind is what a terminal and pipes do differently once the process's ends are
// made: what the shim receives when the process runs, and the terminal's size.
type stdioKind interface {
	// started completes the shim's side once the process runs, before the copies start.
	started(s *stdio) error
	// resize sets the terminal size; errNoTerminal without one.
	resize(width, height uint32) error
	// abort releases what only the kind holds when the process never started.
	abort()
}

// output is one stream the shim copies: from the process's pipe or pty to dst.
type output struct {
	src  *os.File
	dst  io.Writer
	done func() // runs when the copy ends (flushes a log stream)
}

// openStdio prepares the stdio of a process before it is started and sets lp to the
// process's ends. On error nothing stays open.
func openStdio(cfg ioConfig, lp *Stdio, log *slog.Logger) (_ *stdio, retErr error) {
	s := &stdio{log: log, drained: make(chan struct{}), fans: map[string]*fifoio.Fanout{}}
	defer func() {
		if retErr != nil {
			s.abort()
		}
	}()
	open := openPipes
	if cfg.terminal {
		open = openTerminal
	}
	if err := open(s, cfg, lp); err != nil {
		return nil, err
	}
	s.sessions = fifoio.NewAttach(s.fans[crilog.Stdout], s.fans[crilog.Stderr], cfg.terminal, log)
	// Attach sessions write to the process's stdin pipe, which the shim keeps or its
	// copier feeds; a pty master comes only with the start.
	switch {
	case s.inPipe != nil:
		s.sessions.SetStdin(s.inPipe)
	case s.stdin != nil && s.stdin.dst != nil:
		s.sessions.SetStdin(s.stdin.dst)
	}
	return s, nil
}

// terminal is a process's pty: libcontainer's init sends its master over the console
// socket, and the shim copies its output (stdout and stderr in one) and writes its
// input to it.
type terminal struct {
	// sock is the shim's end of the console socket until the pty master arrives.
	sock    int
	console *os.File // the pty master, once received
	out     io.Writer
	outDone func()
	// wantStdin says a stdin was asked for: attach sessions write to the pty.
	wantStdin bool
}

// openTerminal makes s a terminal: the process gets a console socket, and its output
// goes to the CRI log, the caller's stdout FIFO, or nowhere, always through a fanout.
func openTerminal(s *stdio, cfg ioConfig, lp *Stdio) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("console socket: %w", err)
	}
	t := &terminal{sock: fds[0]}
	s.kind = t
	child := os.NewFile(uintptr(fds[1]), "console-socket")
	s.childFiles = append(s.childFiles, child)
	lp.ConsoleSocket = child
	base, baseDone, err := s.terminalOutput(cfg)
	if err != nil {
		return err
	}
	fan := fifoio.NewFanout(base)
	s.fans[crilog.Stdout] = fan
	t.out, t.outDone = fan, func() {
		fan.Close()
		if baseDone != nil {
			baseDone()
		}
	}
	switch {
	case cfg.stdin == "":
	case cfg.stdinMarker && !isFIFO(cfg.stdin):
		// Only a marker: attach sessions write to the pty master.
		t.wantStdin = true
	default:
		c, err := openStdinCopier(cfg.stdin)
		if err != nil {
			return err
		}
		s.stdin = c // its dst, the pty master, arrives after the start
	}
	return nil
}

// terminalOutput is where a terminal's output goes besides attach sessions: the CRI
// log (done closes its stream), the caller's stdout FIFO, or nowhere. Nobody may read
// the terminal, but an unread pty fills up and blocks the process, so it is drained.
func (s *stdio) terminalOutput(cfg ioConfig) (w io.Writer, done func(), err error) {
	switch {
	case cfg.log != nil:
		sink, st := crilog.NewSink(cfg.log, crilog.Stdout, s.log)
		return sink, func() { _ = st.Close() }, nil
	case cfg.stdout != "":
		f, err := os.OpenFile(cfg.stdout, os.O_RDWR, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("open stdout fifo: %w", err)
		}
		s.owned = append(s.owned, f)
		return f, nil, nil
	}
	return io.Discard, nil, nil
}

// started receives the pty master: its output is copied, and stdin goes to it.
func (t *terminal) started(s *stdio) error {
	master, err := recvConsole(t.sock)
	_ = unix.Close(t.sock)
	t.sock = -1
	if err != nil {
		return err
	}
	t.console = master
	s.owned = append(s.owned, master)
	s.outputs = append(s.outputs, output{src: master, dst: t.out, done: t.outDone})
	if s.stdin != nil {
		s.stdin.dst = master
	}
	if s.stdin != nil || t.wantStdin {
		s.sessions.SetStdin(master)
	}
	return nil
}

func (t *terminal) resize(width, height uint32) error {
	if t.console == nil {
		return errNoTerminal
	}
	rc, err := t.console.SyscallConn()
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

// abort closes the console socket and ends the output's fanout and log stream: no
// copy will run.
func (t *terminal) abort() {
	if t.sock >= 0 {
		_ = unix.Close(t.sock)
		t.sock = -1
	}
	if t.outDone != nil {
		t.outDone()
	}
}

// pipes are a process's stdio without a terminal: pipes the shim copies, or the
// caller's FIFOs handed to the process itself.
type pipes struct{}

// openPipes makes s pipes: the process's stdin (a pipe the shim keeps for attach
// sessions, or one fed from the caller's FIFO) and its stdout and stderr.
func openPipes(s *stdio, cfg ioConfig, lp *Stdio) error {
	s.kind = pipes{}
	if err := s.openStdinPipe(cfg, lp); err != nil {
		return err
	}
	direct := map[string]*os.File{}
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
				return err
			}
			sink, st := crilog.NewSink(cfg.log, o.name, s.log)
			s.fanOutput(o.name, r, sink, func() { _ = st.Close() })
		case o.path == "" && cfg.attachable:
			// Nobody reads this output unless an attach session joins, but an unread
			// pipe fills up and blocks the process, so it is drained.
			r, err := s.outputPipe(o.name, o.set)
			if err != nil {
				return err
			}
			s.fanOutput(o.name, r, io.Discard, nil)
		case o.path != "" && cfg.labelled:
			f, err := s.outputFIFO(o.name, o.path, direct)
			if err != nil {
				return err
			}
			direct[o.path] = f
			r, err := s.outputPipe(o.name, o.set)
			if err != nil {
				return err
			}
			s.fanOutput(o.name, r, f, nil)
		case o.path != "":
			// The FIFO itself becomes the process's stdout: no copy, no goroutine,
			// no buffer in the shim. O_RDWR never blocks and keeps a reader, so an
			// early write does not fail before the caller opened its end (containerd's
			// shim keeps a reader open for the same reason).
			f := direct[o.path]
			if f == nil {
				fd, err := unix.Open(o.path, unix.O_RDWR|unix.O_CLOEXEC, 0)
				if err != nil {
					return fmt.Errorf("open %s fifo %s: %w", o.name, o.path, err)
				}
				f = os.NewFile(uintptr(fd), o.path)
				s.childFiles = append(s.childFiles, f)
				direct[o.path] = f
			}
			o.set(f)
		}
	}
	return nil
}

// outputFIFO is the caller's FIFO at path that the shim writes stream name to,
// opened once for both streams when they share it (opened lists those open).
func (s *stdio) outputFIFO(name, path string, opened map[string]*os.File) (*os.File, error) {
	if f := opened[path]; f != nil {
		return f, nil
	}
	// O_RDWR, as for a FIFO handed over: the open never blocks, and a write before the
	// caller opened its end does not fail.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s fifo %s: %w", name, path, err)
	}
	s.owned = append(s.owned, f)
	return f, nil
}

// openStdinPipe gives the process a stdin pipe when it has a stdin: for a marker, the
// shim keeps the write end open for attach sessions (CloseIO closes it); for a FIFO, a
// copier feeds it.
func (s *stdio) openStdinPipe(cfg ioConfig, lp *Stdio) error {
	if cfg.stdin == "" {
		return nil
	}
	marker := cfg.stdinMarker && !isFIFO(cfg.stdin)
	var c *stdinCopier
	if !marker {
		var err error
		if c, err = openStdinCopier(cfg.stdin); err != nil {
			return err
		}
		s.stdin = c
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("stdin pipe: %w", err)
	}
	s.childFiles = append(s.childFiles, r)
	lp.Stdin = r
	if marker {
		s.owned = append(s.owned, w)
		s.inPipe = w
		return nil
	}
	// The copier owns the write end: closing it is how the process sees EOF.
	c.dst = w
	return nil
}

func (pipes) started(*stdio) error        { return nil }
func (pipes) resize(uint32, uint32) error { return errNoTerminal }
func (pipes) abort()                      {}

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
// ends are closed, the kind's ends are received, and the copiers start.
func (s *stdio) started() error {
	for _, f := range s.childFiles {
		_ = f.Close()
	}
	s.childFiles = nil
	if err := s.kind.started(s); err != nil {
		close(s.drained) // no copier will run
		return err
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
		if !s.sessions.WaitStdin(attachStdinFinish, true) {
			s.log.Warn("attach stdin copy did not finish before the stdin was closed")
		}
		_ = s.inPipe.Close()
	}
}

// resize sets the terminal size.
func (s *stdio) resize(width, height uint32) error {
	return s.kind.resize(width, height)
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
	if s.kind != nil {
		s.kind.abort()
	}
	for _, f := range s.owned {
		_ = f.Close()
	}
	if s.stdin != nil {
		s.stdin.stop(s.log)
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
