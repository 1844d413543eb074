package runc

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// execFifoName is the FIFO in a container's libcontainer state dir that its init opens
// for writing and blocks on until the container is started.
const execFifoName = "exec.fifo"

// startInit starts a created container's program as libcontainer's Exec does: it opens
// the exec fifo for reading, which lets the init's open return and the init exec the
// program, reads the byte the init writes and removes the fifo (libcontainer then reports
// the container running). exited is closed when the init has exited: one that died
// before it opened the fifo never will, and the open blocked on it is released.
func startInit(path string, exited <-chan struct{}) error {
	type result struct {
		f   *os.File
		err error
	}
	opened := make(chan result, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_RDONLY, 0)
		opened <- result{f, err}
	}()
	var r result
	dead := false
	select {
	case r = <-opened:
	case <-exited:
		dead = true
		// A writer that opens without blocking (there is a reader waiting) releases
		// the reader's open; it then reads whatever the init wrote before it died.
		if w, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			_ = w.Close()
		}
		r = <-opened
	}
	if r.err != nil {
		return fmt.Errorf("exec fifo: %w", r.err)
	}
	data, err := io.ReadAll(r.f)
	_ = r.f.Close()
	if err != nil {
		return fmt.Errorf("exec fifo: %w", err)
	}
	if len(data) == 0 {
		if dead {
			return errors.New("container process is already dead")
		}
		return errors.New("cannot start an already running container")
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("exec fifo: %w", err)
	}
	return nil
}
