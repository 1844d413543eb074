package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SetSubreaper makes the calling process a child subreaper, so that processes orphaned
// below it (daemonizing container processes) are re-parented to it instead of to init.
func SetSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	return nil
}

// Reaper reaps zombies of processes the shim did not start through it.
type Reaper struct {
	log *slog.Logger

	// mu is held while starting a tracked child and while reaping, so the reaper can
	// never see (and reap) a tracked child before it is recorded as tracked.
	mu      sync.Mutex
	tracked map[int]struct{}
	kick    chan struct{}
}

// New returns a Reaper; call Run to make it reap.
func New(log *slog.Logger) *Reaper {
	return &Reaper{log: log, tracked: map[int]struct{}{}, kick: make(chan struct{}, 1)}
}

// Start starts cmd and records its pid as owned by the caller, who must call Wait.
func (r *Reaper) Start(cmd *exec.Cmd) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	r.tracked[cmd.Process.Pid] = struct{}{}
	return nil
}

// Wait waits for a command started with Start and stops tracking it.
func (r *Reaper) Wait(cmd *exec.Cmd) error {
	err := cmd.Wait()
	r.mu.Lock()
	delete(r.tracked, cmd.Process.Pid)
	r.mu.Unlock()
	// A tracked zombie may have hidden untracked ones behind it (see reapOnce).
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return err
}

// Run reaps orphans on every SIGCHLD until ctx is done.
func (r *Reaper) Run(ctx context.Context) {
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	for {
		r.reapAll()
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-r.kick:
		}
	}
}

func (r *Reaper) reapAll() {
	for r.reapOnce() {
	}
}

// siginfoPidOffset is where si_pid lives in a siginfo_t: after three int32s, aligned
// to the size of a pointer (16 on 64-bit, 12 on 32-bit Linux).
const siginfoPidOffset = (12 + unsafe.Sizeof(uintptr(0)) - 1) &^ (unsafe.Sizeof(uintptr(0)) - 1)

// reapOnce reaps one untracked zombie and reports whether it did. waitid(WNOWAIT) only
// peeks, so a tracked child is left for its owner; since waitid always reports the same
// first zombie, a tracked zombie ends the round, and the owner's Wait kicks a new one.
func (r *Reaper) reapOnce() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		if !errors.Is(err, unix.ECHILD) {
			r.log.Warn("waitid failed", "error", err)
		}
		return false
	}
	pid := int(*(*int32)(unsafe.Add(unsafe.Pointer(&info), siginfoPidOffset)))
	if pid == 0 {
		return false
	}
	if _, ok := r.tracked[pid]; ok {
		return false
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil {
		r.log.Warn("reap orphan failed", "pid", pid, "error", err)
		return false
	}
	r.log.Debug("reaped orphan", "pid", pid, "status", ws.ExitStatus(), "signal", ws.Signal())
	return true
}
