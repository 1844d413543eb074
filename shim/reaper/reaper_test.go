package reaper

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestTrackedChildKeepsItsExitStatus checks that the reaper leaves a child started
// through it to cmd.Wait (which would otherwise fail with ECHILD) while reaping a
// child it does not know.
func TestTrackedChildKeepsItsExitStatus(t *testing.T) {
	r := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	untracked := exec.Command("/bin/sh", "-c", "exit 0")
	if err := untracked.Start(); err != nil {
		t.Fatal(err)
	}
	tracked := exec.Command("/bin/sh", "-c", "exit 7")
	if err := r.Start(tracked); err != nil {
		t.Fatal(err)
	}
	err := r.Wait(tracked)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
		t.Fatalf("Wait = %v, want exit status 7", err)
	}
	pid := untracked.Process.Pid
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Only look: reaping here would hide whether the reaper did it.
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("untracked child %d was not reaped", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStartFuncHoldsReaping checks that helpers a starter forks and waits for itself
// inside StartFunc are never reaped behind its back, and that the pids it returns stay
// with their owner until Forget.
func TestStartFuncHoldsReaping(t *testing.T) {
	r := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	var owned *exec.Cmd
	err := r.StartFunc(func() ([]int, error) {
		// A helper that exits while the starter is still busy: the reaper sees its
		// SIGCHLD, yet must leave the zombie to the starter's Wait.
		helper := exec.Command("/bin/sh", "-c", "exit 3")
		if err := helper.Start(); err != nil {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
		if err := helper.Wait(); err == nil || helper.ProcessState.ExitCode() != 3 {
			return nil, fmt.Errorf("helper Wait = %v, want exit status 3", err)
		}
		owned = exec.Command("/bin/sh", "-c", "exit 5")
		if err := owned.Start(); err != nil {
			return nil, err
		}
		return []int{owned.Process.Pid}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the owned child is a zombie by now
	if err := owned.Wait(); err == nil || owned.ProcessState.ExitCode() != 5 {
		t.Fatalf("owned Wait = %v, want exit status 5", err)
	}
	r.Forget(owned.Process.Pid)
}
