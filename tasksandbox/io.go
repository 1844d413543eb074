package tasksandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/crilog"
	"github.com/crisp-runtime/crisp/internal/fifoio"
)

// A task-only shim copies a container's output to the FIFOs it is given and knows
// nothing of CRI logs: criserver reads the FIFOs and writes the CRI log, as containerd
// does. The shim holds a read end of each FIFO too (containerd's shims do), so while
// criserver is down the container's writes block only once the pipe buffer is full,
// and the copy resumes from the same FIFOs after a restart (see Sandboxer.RecoverIO).

// ioFile is the record in a task-only shim's container bundle from which recovery
// resumes the copy.
const ioFile = "io.json"

// IORecord says where a container's output goes.
type IORecord struct {
	SandboxID string `json:"sandbox_id"`
	LogPath   string `json:"log_path,omitempty"`
	Terminal  bool   `json:"terminal,omitempty"`
	Stdin     bool   `json:"stdin,omitempty"`
}

// IODrainTimeout bounds how long the exit of a container waits for its last output
// to reach the log.
const IODrainTimeout = 2 * time.Second

// fifoPaths are the FIFOs of a container's stdio in its bundle; "" for none.
func (r IORecord) fifoPaths(bundle string) (stdin, stdout, stderr string) {
	if r.Stdin {
		stdin = filepath.Join(bundle, "stdin")
	}
	stdout = filepath.Join(bundle, "stdout")
	if !r.Terminal {
		// A terminal's output is one stream, which the shim writes to stdout.
		stderr = filepath.Join(bundle, "stderr")
	}
	return stdin, stdout, stderr
}

// IO copies one container's output into its CRI log and to attach sessions, and
// attach sessions' input into its stdin.
type IO struct {
	terminal bool
	log      *crilog.Writer // nil without a log path: output goes to attach sessions only
	// in is criserver's writer on the stdin FIFO, kept so stdin sees no EOF between
	// attach sessions, until CloseStdin.
	inMu sync.Mutex
	in   *os.File
	outs []*os.File
	// fans carry each output stream (crilog.Stdout, crilog.Stderr) to the log and to
	// attach sessions.
	fans map[string]*fifoio.Fanout
	// sessions are the attach sessions; their stdin goes to in.
	sessions *fifoio.Attach
	// done is closed by the copy's owner goroutine once every stream ended.
	done chan struct{}
}

// newIO makes the FIFOs (when create) and starts copying from them. The read ends
// are open when it returns, so the shim's opens for writing never block.
func newIO(bundle string, r IORecord, create bool, log *slog.Logger) (_ *IO, retErr error) {
	stdin, stdout, stderr := r.fifoPaths(bundle)
	if create {
		if err := makeIO(bundle, r, stdin, stdout, stderr); err != nil {
			return nil, err
		}
	}
	t := &IO{terminal: r.Terminal, fans: map[string]*fifoio.Fanout{}, done: make(chan struct{})}
	defer func() {
		if retErr != nil {
			t.Close()
		}
	}()
	streams, err := t.openFIFOs(stdin, stdout, stderr)
	if err != nil {
		return nil, err
	}
	if r.LogPath != "" {
		w, err := crilog.Open(r.LogPath, 0)
		if err != nil {
			return nil, fmt.Errorf("open log %s: %w", r.LogPath, err)
		}
		t.log = w
	}
	t.startCopies(streams, log)
	t.sessions = fifoio.NewAttach(t.fans[crilog.Stdout], t.fans[crilog.Stderr], t.terminal, log)
	if t.in != nil {
		t.sessions.SetStdin(t.in)
	}
	return t, nil
}

// makeIO writes the bundle's io.json and makes the FIFOs ("" = none).
func makeIO(bundle string, r IORecord, fifos ...string) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, ioFile), data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", ioFile, err)
	}
	for _, p := range fifos {
		if p == "" {
			continue
		}
		if err := unix.Mkfifo(p, 0o600); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make FIFO %s: %w", p, err)
		}
	}
	return nil
}

// outputFIFO is an output FIFO's read end and its stream's crilog name.
type outputFIFO struct {
	f    *os.File
	name string
}

// openFIFOs opens criserver's ends of the FIFOs ("" = none) without blocking; t owns
// them from then on.
func (t *IO) openFIFOs(stdin, stdout, stderr string) ([]outputFIFO, error) {
	if stdin != "" {
		// Read-write: it never blocks, and the shim's reader sees no EOF.
		f, err := os.OpenFile(stdin, os.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open stdin FIFO: %w", err)
		}
		t.in = f
	}
	var outs []outputFIFO
	for _, o := range []struct{ name, path string }{{crilog.Stdout, stdout}, {crilog.Stderr, stderr}} {
		if o.path == "" {
			continue
		}
		f, err := os.OpenFile(o.path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open output FIFO: %w", err)
		}
		t.outs = append(t.outs, f)
		outs = append(outs, outputFIFO{f: f, name: o.name})
	}
	return outs, nil
}

// startCopies copies each output FIFO through its stream's fanout into the log (or
// nowhere without one); done closes, and the log with it, once every stream ended.
func (t *IO) startCopies(outs []outputFIFO, log *slog.Logger) {
	var wg sync.WaitGroup
	for _, o := range outs {
		var (
			dst io.Writer
			st  *crilog.Stream
		)
		if t.log != nil {
			dst, st = crilog.NewSink(t.log, o.name, log)
		} else {
			dst = io.Discard
		}
		fan := fifoio.NewFanout(dst)
		t.fans[o.name] = fan
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fifoio.CopyFIFOIn(fan, o.f); err != nil && !errors.Is(err, os.ErrClosed) {
				log.Warn("copy container output", "fifo", o.f.Name(), "err", err)
			}
			fan.Close()
			if st != nil {
				_ = st.Close()
			}
		}()
	}
	go func() {
		wg.Wait()
		if t.log != nil {
			_ = t.log.Close()
		}
		close(t.done)
	}()
}

// Wait waits up to timeout for the output to end (the shim closed its ends).
func (t *IO) Wait(timeout time.Duration) bool {
	select {
	case <-t.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Close stops the copy at once; what the FIFOs still hold is lost. Attach sessions'
// stdin copies end with it.
func (t *IO) Close() {
	if t.sessions != nil {
		t.sessions.Close()
	}
	for _, f := range t.outs {
		_ = f.Close()
	}
	t.inMu.Lock()
	if t.in != nil {
		_ = t.in.Close()
		t.in = nil
	}
	t.inMu.Unlock()
}

// Reopen has the log follow a rotation by kubelet; FailedPrecondition once the
// container's output has ended.
func (t *IO) Reopen() error {
	if t.log == nil {
		return errors.New("the container has no log path")
	}
	if err := t.log.Reopen(); err != nil {
		if errors.Is(err, crilog.ErrClosed) {
			return fmt.Errorf("the container is not running: %w", errdefs.ErrFailedPrecondition)
		}
		return err
	}
	return nil
}

// readIORecord reads a container bundle's io.json; ok is false for a container of a
// shim that writes its log itself.
func readIORecord(bundle string) (IORecord, bool) {
	var r IORecord
	data, err := os.ReadFile(filepath.Join(bundle, ioFile))
	if err != nil || json.Unmarshal(data, &r) != nil {
		return r, false
	}
	return r, true
}

// drain copies what the output FIFOs hold without waiting for more, then ends the
// copy: for a container whose writers left while criserver was down.
func (t *IO) drain() {
	for _, f := range t.outs {
		rc, err := f.SyscallConn()
		if err != nil {
			continue
		}
		_ = rc.Control(func(fd uintptr) {
			for {
				if n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0); err != nil || n == 0 {
					return
				}
				// The copy goroutine reads it; give it a moment per pipe-full.
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	t.Close()
	t.Wait(IODrainTimeout)
}

// Errors of IO.attach.
var (
	errAttachEnded   = errors.New("the container's output has ended")
	errAttachNoStdin = errors.New("the container has no stdin (its config has stdin false, or stdin_once closed it)")
)

// attach connects an attach session's FIFOs ("" = none) through the attach fan-out the
// shim uses too (fifoio.Attach): output sinks live until their reader closes them or
// the stream ends, and one that falls behind is dropped without slowing the log; the
// stdin FIFO is copied into the container's stdin until its writers are gone.
func (t *IO) attach(stdinPath, stdoutPath, stderrPath string) error {
	err := t.sessions.Attach(stdinPath, stdoutPath, stderrPath)
	switch {
	case errors.Is(err, fifoio.ErrAttachClosed):
		return errAttachEnded
	case errors.Is(err, fifoio.ErrNoStdin):
		return errAttachNoStdin
	}
	return err
}

// stdinDrainTimeout bounds how long closing a container's stdin waits for what attach
// sessions wrote to reach it.
const stdinDrainTimeout = time.Second

// CloseStdin ends the container's stdin (CloseIO, for stdin_once): criserver's writer
// on the FIFO goes, so that once the shim drops its own the shim's copy reads EOF. It
// first waits, up to stdinDrainTimeout, for ended attach sessions' input to be copied
// and for the shim to have read the FIFO empty, so that nothing a client sent is lost.
func (t *IO) CloseStdin() {
	t.inMu.Lock()
	defer t.inMu.Unlock()
	if t.in == nil {
		return
	}
	// New sessions get no stdin from here.
	t.sessions.SetStdin(nil)
	t.drainStdin()
	_ = t.in.Close()
	t.in = nil
}

func (t *IO) drainStdin() {
	deadline := time.Now().Add(stdinDrainTimeout)
	// Every session's stdin copy is waited for, where the shim's CloseIO waits only for
	// those whose clients are gone: criserver's copies write into the FIFO the shim
	// reads, and this one deadline bounds both this wait and the FIFO's drain below.
	t.sessions.WaitStdin(stdinDrainTimeout, false)
	rc, err := t.in.SyscallConn()
	if err != nil {
		return
	}
	for time.Now().Before(deadline) {
		pending := 0
		if cerr := rc.Control(func(fd uintptr) {
			// TIOCINQ is FIONREAD: the bytes the pipe holds unread.
			pending, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ)
		}); cerr != nil || err != nil || pending == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
