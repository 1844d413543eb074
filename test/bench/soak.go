package bench

import (
	"context"
	"fmt"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// settle is how long memory is left to settle before a soak reading: crisp's shim
// returns what work freed to the kernel a second after the work.
const settle = 2 * time.Second

// ExecSoak runs ExecSync `true` n times into container (of the pod podID) and returns
// the shim's memory after the first exec, after the warm-th and after the last, each
// after settle. A Go shim's heap grows for its first execs (crisp's for ~100) before
// it stays flat, so growth from the first reading is partly warm-up; from the warm-th
// it is what work leaves behind.
func (w *Workload) ExecSoak(ctx context.Context, podID, container string, n, warm int) (first, warmed, last Mem, err error) {
	pid, err := w.SandboxPid(ctx, podID)
	if err != nil {
		return first, warmed, last, err
	}
	shim, err := PPid(pid)
	if err != nil {
		return first, warmed, last, err
	}
	read := func() (Mem, error) {
		select {
		case <-ctx.Done():
			return Mem{}, ctx.Err()
		case <-time.After(settle):
		}
		return ReadMem(shim)
	}
	for i := range n {
		r, err := w.D.RT.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: container, Cmd: []string{"true"}, Timeout: 10})
		if err != nil {
			return first, warmed, last, fmt.Errorf("exec %d: %w", i+1, err)
		}
		if r.ExitCode != 0 {
			return first, warmed, last, fmt.Errorf("exec %d: `true` exited %d: %s", i+1, r.ExitCode, r.Stderr)
		}
		if i == 0 {
			if first, err = read(); err != nil {
				return first, warmed, last, err
			}
		}
		if i+1 == warm && warm < n {
			if warmed, err = read(); err != nil {
				return first, warmed, last, err
			}
		}
	}
	last, err = read()
	return first, warmed, last, err
}

// CycleSoak runs pod cycles from clients concurrent clients and reads the daemon's
// memory (after settle) once at and once at total cycles.
func (w *Workload) CycleSoak(ctx context.Context, at, total, clients int) (first, last Mem, err error) {
	read := func() (Mem, error) {
		select {
		case <-ctx.Done():
			return Mem{}, ctx.Err()
		case <-time.After(settle):
		}
		return ReadMem(w.D.Pid())
	}
	cycle := func(ctx context.Context, _ int) error {
		_, err := w.Cycle(ctx)
		return err
	}
	if err := Parallel(ctx, at, clients, cycle); err != nil {
		return first, last, err
	}
	if first, err = read(); err != nil {
		return first, last, err
	}
	if err := Parallel(ctx, total-at, clients, cycle); err != nil {
		return first, last, err
	}
	last, err = read()
	return first, last, err
}

// Growth is how much after exceeds before, in percent of before.
func Growth(before, after float64) float64 {
	if before == 0 {
		return 0
	}
	return (after - before) / before * 100
}
