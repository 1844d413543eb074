package task

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	taskapi "github.com/crisp-runtime/crisp/api/containerd/types/task"
)

// process is a container's init or one of its execs.
type process struct {
	execID string // "" for the init
	io     ioConfig
	// spec is an exec's OCI process (JSON, decoded only by the helper) until it starts.
	spec []byte

	mu sync.Mutex
	// pid and stdio are set once when the process starts.
	pid   int
	stdio *stdio
	// pidfd refers to the process from its start until it is reaped (closed then, under
	// mu): signals through it never hit a process that reused the pid.
	pidfd *os.File
	// early is the wait status of a process that exited, and was reaped as an orphan,
	// before the shim learnt its pid from the helper that started it.
	early      *unix.WaitStatus
	status     taskapi.Status
	exitStatus uint32
	exitedAt   time.Time
	// done is closed once the exit is recorded (and the output drained, within bounds).
	done chan struct{}
}

func newProcessState(execID string, io ioConfig) *process {
	return &process{execID: execID, io: io, status: taskapi.Status_CREATED, done: make(chan struct{})}
}

// state returns the status and exit of the process.
func (p *process) state() (taskapi.Status, uint32, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status, p.exitStatus, p.exitedAt
}

// setStarted records the started process: claimed, its pid is tracked for the shim
// (exited false) or was already reaped with status ws (exited true). A pidfd is opened
// for a tracked pid; the pid cannot be reused before the shim reaps it.
func (p *process) setStarted(pid int, sio *stdio, ws unix.WaitStatus, exited bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pid, p.stdio = pid, sio
	if exited {
		p.early = &ws
		return nil
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	p.pidfd = os.NewFile(uintptr(fd), "pidfd")
	return nil
}

// started returns the pid and stdio (0 and nil before the start).
func (p *process) started() (int, *stdio) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid, p.stdio
}

// setRunning marks a created process running; an exit recorded meanwhile wins.
func (p *process) setRunning() {
	p.mu.Lock()
	if p.status == taskapi.Status_CREATED {
		p.status = taskapi.Status_RUNNING
	}
	p.mu.Unlock()
}

// setExited records the exit and wakes Wait callers.
func (p *process) setExited(status uint32, at time.Time) {
	p.mu.Lock()
	p.status, p.exitStatus, p.exitedAt = taskapi.Status_STOPPED, status, at.UTC()
	if p.pidfd != nil {
		_ = p.pidfd.Close()
		p.pidfd = nil
	}
	p.mu.Unlock()
	close(p.done)
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process through its pidfd; ErrProcessDone once it has exited.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pid == 0 {
		return errNotStarted
	}
	if p.pidfd == nil {
		return os.ErrProcessDone
	}
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return fmt.Errorf("signal pid %d: %w", p.pid, err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); err != nil {
		return fmt.Errorf("signal pid %d: %w", p.pid, err)
	}
	switch {
	case errors.Is(serr, unix.ESRCH):
		return os.ErrProcessDone
	case serr != nil:
		return fmt.Errorf("signal pid %d: %w", p.pid, serr)
	}
	return nil
}

// wait blocks until the process has exited, reaps it and returns its wait status. The
// wait on the pidfd goes through the runtime poller: a plain wait4 would park one OS
// thread per running process for as long as it runs.
func (p *process) wait(r Reaper) (unix.WaitStatus, error) {
	p.mu.Lock()
	pid, fd, early := p.pid, p.pidfd, p.early
	p.mu.Unlock()
	if early != nil {
		return *early, nil
	}
	// fd stays open: only setExited, after this returns, closes it. Without one (it
	// could not be opened) wait4 blocks a thread instead.
	if fd != nil {
		if err := waitPidfd(fd); err != nil {
			return 0, err
		}
	}
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		r.Forget(pid)
		if err != nil {
			return 0, fmt.Errorf("wait4 %d: %w", pid, err)
		}
		return ws, nil
	}
}

var errNotStarted = errors.New("process not started")

// waitExited blocks until pid has exited, without reaping it.
func waitExited(pid int) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	return waitPidfd(f)
}

// waitPidfd blocks until the process of the pidfd f has exited, without reaping it.
func waitPidfd(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		// si_signo is SIGCHLD once there is an exit to report, 0 while it runs.
		return err != nil || info.Signo != 0
	})
}

// exitStatus is the status containerd reports: the exit code, or 128+signal.
func exitStatus(ws unix.WaitStatus) uint32 {
	if ws.Signaled() {
		return 128 + uint32(ws.Signal())
	}
	return uint32(ws.ExitStatus())
}
