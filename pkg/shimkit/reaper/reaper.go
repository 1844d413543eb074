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

	// gate is held shared while children are started (several starts may run at once)
	// and exclusively while reaping, so the reaper can never see (and reap) a child
	// before it is recorded as tracked, nor a helper a starter waits for itself.
	gate sync.RWMutex
	// mu guards tracked and subs.
	mu      sync.Mutex
	tracked map[int]struct{}
	// subs record the exits of untracked children while their owners start processes
	// through a helper that exits before saying which pid it started (see Subscribe).
	subs map[*Subscription]struct{}
	kick chan struct{}
}

// Subscription records the exit status of every untracked child the reaper reaps while
// it is open. A process a helper starts is re-parented to the shim when the helper
// exits and may exit, and be reaped as an orphan, before its owner learns its pid:
// its owner subscribes before it runs the helper and claims the pid after (Claim), as
// containerd's runc shim does with its exit subscribers.
type Subscription struct {
	r *Reaper
	// exits is guarded by r.mu.
	exits map[int]unix.WaitStatus
}

// Subscribe opens a Subscription; the caller must Close it.
func (r *Reaper) Subscribe() *Subscription {
	s := &Subscription{r: r, exits: map[int]unix.WaitStatus{}}
	r.mu.Lock()
	r.subs[s] = struct{}{}
	r.mu.Unlock()
	return s
}

// Close stops recording exits.
func (s *Subscription) Close() {
	s.r.mu.Lock()
	delete(s.r.subs, s)
	s.r.mu.Unlock()
}

// Claim hands pid, a child of the shim (or an orphan re-parented to it) that the
// subscriber learnt of, to its caller: if the reaper has already reaped it since sub was
// opened, Claim returns its wait status and true; otherwise pid is tracked from now on
// and the caller must reap it and then call Forget.
func (r *Reaper) Claim(sub *Subscription, pid int) (unix.WaitStatus, bool) {
	// Shared: no reap round runs between the look into sub and the tracking.
	r.gate.RLock()
	defer r.gate.RUnlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if ws, ok := sub.exits[pid]; ok {
		return ws, true
	}
	r.tracked[pid] = struct{}{}
	return 0, false
}

// Adopt opens a Subscription for a caller that sees the reaper only through an
// interface of functions (the pause package): claim is Claim on it, done its Close.
func (r *Reaper) Adopt() (claim func(pid int) (unix.WaitStatus, bool), done func()) {
	sub := r.Subscribe()
	return func(pid int) (unix.WaitStatus, bool) { return r.Claim(sub, pid) }, sub.Close
}

// New returns a Reaper; call Run to make it reap.
func New(log *slog.Logger) *Reaper {
	return &Reaper{log: log, tracked: map[int]struct{}{}, subs: map[*Subscription]struct{}{}, kick: make(chan struct{}, 1)}
}

// Start starts cmd and records its pid as owned by the caller, who must call Wait.
func (r *Reaper) Start(cmd *exec.Cmd) error {
	return r.StartFunc(func() ([]int, error) {
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return []int{cmd.Process.Pid}, nil
	})
}

// StartFunc runs start with reaping held off and records the pids it returns as owned by
// the caller, who must wait for each and then call Forget. It is for starters that fork
// and wait for helper processes of their own (libcontainer's init stages, hooks): the
// reaper must not reap those either, and it cannot know their pids. start must not call
// StartFunc itself: a reaper waiting for the gate would deadlock it.
func (r *Reaper) StartFunc(start func() ([]int, error)) error {
	r.gate.RLock()
	defer r.gate.RUnlock()
	pids, err := start()
	if len(pids) > 0 {
		r.mu.Lock()
		for _, pid := range pids {
			r.tracked[pid] = struct{}{}
		}
		r.mu.Unlock()
	}
	return err
}

// Wait waits for a command started with Start and stops tracking it.
func (r *Reaper) Wait(cmd *exec.Cmd) error {
	err := cmd.Wait()
	r.Forget(cmd.Process.Pid)
	return err
}

// Forget stops tracking pid; its owner calls it once it has waited for the process.
func (r *Reaper) Forget(pid int) {
	r.mu.Lock()
	delete(r.tracked, pid)
	r.mu.Unlock()
	// A tracked zombie may have hidden untracked ones behind it (see reapOnce).
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run reaps orphans on every SIGCHLD until ctx is done.
func (r *Reaper) Run(ctx context.Context) {
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	for {
		// A stopped reaper must not reap: select picks at random among ready cases, so
		// a SIGCHLD arriving after ctx ended could otherwise start one more round and
		// take a child's status from whoever reaps after it.
		if ctx.Err() != nil {
			return
		}
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
	r.gate.Lock()
	defer r.gate.Unlock()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		if !errors.Is(err, unix.ECHILD) {
			r.log.Warn("waitid failed", "error", err)
		}
		return false
	}
	// x/sys/unix has no accessor for si_pid; siginfoPidOffset is its offset in the kernel ABI.
	pid := int(*(*int32)(unsafe.Add(unsafe.Pointer(&info), siginfoPidOffset))) //nolint:gosec // G103: see above
	if pid == 0 {
		return false
	}
	r.mu.Lock()
	_, ok := r.tracked[pid]
	r.mu.Unlock()
	if ok {
		return false
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil {
		r.log.Warn("reap orphan failed", "pid", pid, "error", err)
		return false
	}
	r.mu.Lock()
	for sub := range r.subs {
		sub.exits[pid] = ws
	}
	r.mu.Unlock()
	r.log.Debug("reaped orphan", "pid", pid, "status", ws.ExitStatus(), "signal", ws.Signal())
	return true
}
