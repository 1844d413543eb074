package task

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	taskapi "github.com/crisp-runtime/crisp/api/containerd/types/task"
	"github.com/opencontainers/runc/libcontainer"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// process is a container's init or one of its execs.
type process struct {
	execID string // "" for the init
	io     ioConfig
	// spec is an exec's process until it is started.
	spec *specs.Process

	mu sync.Mutex
	// lp, pid and stdio are set once when the process starts.
	lp         *libcontainer.Process
	pid        int
	stdio      *stdio
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

// setStarted records the started process.
func (p *process) setStarted(lp *libcontainer.Process, pid int, sio *stdio) {
	p.mu.Lock()
	p.lp, p.pid, p.stdio = lp, pid, sio
	p.mu.Unlock()
}

// started returns what setStarted recorded (nils before).
func (p *process) started() (*libcontainer.Process, int, *stdio) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lp, p.pid, p.stdio
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

// signal sends sig to the process; ErrProcessDone once it has exited. libcontainer
// signals through the pidfd Go keeps for the process, so a reused pid is never hit.
func (p *process) signal(sig syscall.Signal) error {
	lp, pid, _ := p.started()
	if lp == nil {
		return errNotStarted
	}
	if err := lp.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return err
		}
		return fmt.Errorf("signal pid %d: %w", pid, err)
	}
	return nil
}

var errNotStarted = errors.New("process not started")

// waitExited blocks until pid has exited, without reaping it (libcontainer's Wait does
// that next). It waits on a pidfd through the runtime poller: a plain Wait would park
// one OS thread in waitid per running process for as long as it runs.
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
func exitStatus(ps *os.ProcessState) uint32 {
	if ps == nil {
		return 255
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
		if ws.Signaled() {
			return 128 + uint32(ws.Signal())
		}
		return uint32(ws.ExitStatus())
	}
	return uint32(ps.ExitCode())
}
