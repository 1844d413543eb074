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

// TestClaimAfterOrphanExit checks both outcomes of the race between a process started
// behind the owner's back and the owner learning its pid: a child that exits and is
// reaped before Claim gives its status to the subscription, and one claimed while it
// runs is left to its owner.
func TestClaimAfterOrphanExit(t *testing.T) {
	r := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	sub := r.Subscribe()
	defer sub.Close()
	early := exec.Command("/bin/sh", "-c", "exit 9")
	if err := early.Start(); err != nil {
		t.Fatal(err)
	}
	pid := early.Process.Pid
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d was not reaped", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ws, exited := r.Claim(sub, pid)
	if !exited || ws.ExitStatus() != 9 {
		t.Fatalf("Claim(%d) = %v, %v; want exit status 9, true", pid, ws, exited)
	}

	late := exec.Command("/bin/sh", "-c", "sleep 0.2; exit 4")
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	if _, exited := r.Claim(sub, late.Process.Pid); exited {
		t.Fatal("Claim of a running child reported an exit")
	}
	time.Sleep(400 * time.Millisecond) // a zombie by now, and the reaper saw SIGCHLD
	if err := late.Wait(); err == nil || late.ProcessState.ExitCode() != 4 {
		t.Fatalf("Wait of claimed child = %v, want exit status 4", err)
	}
	r.Forget(late.Process.Pid)

	// Exits after Close are not recorded.
	sub.Close()
	after := exec.Command("/bin/true")
	if err := after.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, exited := r.Claim(sub, after.Process.Pid); exited {
		t.Fatal("a closed subscription recorded an exit")
	}
	r.Forget(after.Process.Pid)
}
