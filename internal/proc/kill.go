package proc

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// exitPoll is how often KillVerified looks whether the process has begun to exit.
const exitPoll = 5 * time.Millisecond

// KillVerified sends SIGKILL to pid if it is still the process that started at startTime,
// then waits up to timeout for it to exit. It reports whether it sent the signal.
func KillVerified(pid int, startTime uint64, timeout time.Duration) (bool, error) {
	if pid <= 0 {
		return false, nil
	}
	// The pidfd pins the process, so the identity check below and the kill refer to the
	// same process even if the pid is recycled in between.
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	alive, err := Alive(pid, startTime)
	if err != nil || !alive {
		return false, err
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("kill %d: %w", pid, err)
	}
	// A pidfd polls readable once the process has exited, child of ours or not. A
	// process already in exit counts as killed too: it runs no code any more, and a pid
	// namespace's init stays in exit until every process of its namespace was reaped,
	// which for the orphans of a dead shim is the host init's job (on some machines
	// seconds late).
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return true, fmt.Errorf("pid %d still running %s after SIGKILL", pid, timeout)
		}
		if st, err := ReadStat(pid); err == nil && st.StartTime == startTime && st.Exiting() {
			return true, nil
		}
		n, err := unix.Poll(fds, int(min(left, exitPoll).Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return true, fmt.Errorf("poll pidfd of %d: %w", pid, err)
		}
		if n > 0 {
			return true, nil
		}
	}
}
