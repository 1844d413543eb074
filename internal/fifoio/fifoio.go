// Package fifoio copies the streams of container processes (pipes, FIFOs, ptys)
// through the Go runtime's poller, so that an idle stream costs a parked goroutine and
// no thread or buffer. The shim copies with it, and so does criserver for the pods of
// task-only shims, whose output it reads from FIFOs.
package fifoio

import (
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// bufPool holds copy buffers shared by every stream of the process.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// readStep is the outcome of one read attempt of copyLoop.
type readStep int

const (
	stepData  readStep = iota // n bytes were read
	stepAgain                 // nothing yet: wait for the fd to be readable again
	stepEOF                   // the stream ended (with the error, if any)
)

// copyLoop copies src to dst, one step at a time, until a step reports EOF or an
// error. src must be pollable (a pipe, FIFO or pty). A step borrows a pool buffer
// through take only when it reads, and a step that finds nothing gives it back, so an
// idle stream, the usual state, holds none.
func copyLoop(dst io.Writer, src *os.File, step func(fd int, take func() []byte) (int, readStep, error)) error {
	rc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	for {
		var (
			buf  *[]byte
			n    int
			res  readStep
			rerr error
		)
		take := func() []byte {
			if buf == nil {
				buf = bufPool.Get().(*[]byte)
			}
			return *buf
		}
		err := rc.Read(func(fd uintptr) bool {
			n, res, rerr = step(int(fd), take)
			if res == stepAgain && buf != nil {
				bufPool.Put(buf)
				buf = nil
			}
			return res != stepAgain
		})
		if err == nil && rerr == nil && res == stepData {
			_, err = dst.Write((*buf)[:n])
			bufPool.Put(buf)
			if err != nil {
				return err
			}
			continue
		}
		if buf != nil {
			bufPool.Put(buf)
		}
		if err != nil {
			return err
		}
		return rerr
	}
}

// CopyFile copies src to dst until EOF, a read error or src being closed.
func CopyFile(dst io.Writer, src *os.File) error {
	return copyLoop(dst, src, func(fd int, take func() []byte) (int, readStep, error) {
		for {
			n, err := unix.Read(fd, take())
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return 0, stepAgain, nil
			case err == unix.EIO:
				// How a pty master reports that the last slave fd closed.
				return 0, stepEOF, nil
			case err != nil:
				return 0, stepEOF, err
			case n == 0:
				return 0, stepEOF, nil
			}
			return n, stepData, nil
		}
	})
}

// CopyFIFOIn copies the FIFO src to dst until its writers are gone. A FIFO opened for
// reading without a writer reads EOF at once, so the copy waits for POLLIN or for
// POLLHUP, which the kernel reports only once a writer has come and gone.
func CopyFIFOIn(dst io.Writer, src *os.File) error {
	return copyLoop(dst, src, func(fd int, take func() []byte) (int, readStep, error) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, 0); err != nil {
			if err == unix.EINTR {
				return 0, stepAgain, nil
			}
			return 0, stepEOF, err
		}
		re := pfd[0].Revents
		switch {
		case re&unix.POLLIN != 0:
			n, err := unix.Read(fd, take())
			switch {
			case err == unix.EAGAIN || err == unix.EINTR:
				return 0, stepAgain, nil
			case err != nil:
				return 0, stepEOF, err
			case n == 0:
				return 0, stepEOF, nil
			}
			return n, stepData, nil
		case re&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0:
			return 0, stepEOF, nil
		}
		return 0, stepAgain, nil
	})
}
