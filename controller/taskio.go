package controller

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/fifoio"
	"github.com/crisp-runtime/crisp/shim/crilog"
)

// A task-only shim copies a container's output to the FIFOs it is given and knows
// nothing of CRI logs: criserver reads the FIFOs and writes the CRI log, as containerd
// does. The shim holds a read end of each FIFO too (containerd's shims do), so while
// criserver is down the container's writes block only once the pipe buffer is full,
// and the copy resumes from the same FIFOs after a restart (see recoverTaskIO).

// ioFile is the record in a task-only shim's container bundle from which recovery
// resumes the copy.
const ioFile = "io.json"

// ioRecord says where a container's output goes.
type ioRecord struct {
	SandboxID string `json:"sandbox_id"`
	LogPath   string `json:"log_path,omitempty"`
	Terminal  bool   `json:"terminal,omitempty"`
	Stdin     bool   `json:"stdin,omitempty"`
}

// ioDrainTimeout bounds how long the exit of a container waits for its last output
// to reach the log.
const ioDrainTimeout = 2 * time.Second

// fifoPaths are the FIFOs of a container's stdio in its bundle; "" for none.
func (r ioRecord) fifoPaths(bundle string) (stdin, stdout, stderr string) {
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

// taskIO copies one container's output into its CRI log.
type taskIO struct {
	log  *crilog.Writer // nil without a log path: output is drained and dropped
	in   *os.File       // criserver's end of the stdin FIFO, kept so stdin never sees EOF
	outs []*os.File
	// done is closed by the copy's owner goroutine once every stream ended.
	done chan struct{}
}

// newTaskIO makes the FIFOs (when create) and starts copying from them. The read ends
// are open when it returns, so the shim's opens for writing never block.
func newTaskIO(bundle string, r ioRecord, create bool, log *slog.Logger) (_ *taskIO, retErr error) {
	if create {
		data, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(bundle, ioFile), data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", ioFile, err)
		}
	}
	stdin, stdout, stderr := r.fifoPaths(bundle)
	t := &taskIO{done: make(chan struct{})}
	defer func() {
		if retErr != nil {
			t.close()
		}
	}()
	for _, p := range []string{stdin, stdout, stderr} {
		if p == "" || !create {
			continue
		}
		if err := unix.Mkfifo(p, 0o600); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("make FIFO %s: %w", p, err)
		}
	}
	if stdin != "" {
		// Read-write: it never blocks, and the shim's reader sees no EOF.
		f, err := os.OpenFile(stdin, os.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open stdin FIFO: %w", err)
		}
		t.in = f
	}
	type stream struct {
		f    *os.File
		name string
	}
	var streams []stream
	for _, s := range []stream{{name: crilog.Stdout}, {name: crilog.Stderr}} {
		p := stdout
		if s.name == crilog.Stderr {
			p = stderr
		}
		if p == "" {
			continue
		}
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open output FIFO: %w", err)
		}
		t.outs = append(t.outs, f)
		s.f = f
		streams = append(streams, s)
	}
	if r.LogPath != "" {
		w, err := crilog.Open(r.LogPath, 0)
		if err != nil {
			return nil, fmt.Errorf("open log %s: %w", r.LogPath, err)
		}
		t.log = w
	}
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst *crilog.Stream
			if t.log != nil {
				dst = t.log.Stream(s.name)
			}
			err := fifoio.CopyFIFOIn(&logSink{s: dst, log: log, path: r.LogPath}, s.f)
			if err != nil && !errors.Is(err, os.ErrClosed) {
				log.Warn("copy container output", "fifo", s.f.Name(), "err", err)
			}
			if dst != nil {
				_ = dst.Close()
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
	return t, nil
}

// logSink writes to a CRI log stream and never fails the copy: output that cannot be
// written is dropped (crilog counts it), and the FIFO keeps draining.
type logSink struct {
	s      *crilog.Stream
	log    *slog.Logger
	path   string
	warned bool
}

func (l *logSink) Write(p []byte) (int, error) {
	if l.s == nil {
		return len(p), nil
	}
	if _, err := l.s.Write(p); err != nil && !l.warned {
		l.warned = true
		l.log.Warn("container log not written; output is dropped", "log", l.path, "err", err)
	}
	return len(p), nil
}

// wait waits up to timeout for the output to end (the shim closed its ends).
func (t *taskIO) wait(timeout time.Duration) bool {
	select {
	case <-t.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// close stops the copy at once; what the FIFOs still hold is lost.
func (t *taskIO) close() {
	for _, f := range t.outs {
		_ = f.Close()
	}
	if t.in != nil {
		_ = t.in.Close()
	}
}

// reopen has the log follow a rotation by kubelet.
func (t *taskIO) reopen() error {
	if t.log == nil {
		return errors.New("the container has no log path")
	}
	return t.log.Reopen()
}

// readIORecord reads a container bundle's io.json; ok is false for a container of a
// shim that writes its log itself.
func readIORecord(bundle string) (ioRecord, bool) {
	var r ioRecord
	data, err := os.ReadFile(filepath.Join(bundle, ioFile))
	if err != nil || json.Unmarshal(data, &r) != nil {
		return r, false
	}
	return r, true
}

// drain copies what the output FIFOs hold without waiting for more, then ends the
// copy: for a container whose writers left while criserver was down.
func (t *taskIO) drain() {
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
	t.close()
	t.wait(ioDrainTimeout)
}
