package network

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// startOrphanPlugin starts a stand-in for a CNI plugin a dead criserver left running
// for pod id: the script in its own process group, with the pod in its environment.
func startOrphanPlugin(t *testing.T, id, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + id, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd
}

func TestAwaitOrphanPlugins(t *testing.T) {
	tests := []struct {
		name     string
		script   string
		wantKill bool
	}{
		{"finishes within the timeout", "sleep 0.1", false},
		{"hangs past the timeout", "sleep 1000 & wait", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeNet(t, 500*time.Millisecond, "noop")
			id := fakePod().ID
			cmd := startOrphanPlugin(t, id, tt.script)
			waited := make(chan error, 1)
			go func() { waited <- cmd.Wait() }()
			time.Sleep(50 * time.Millisecond) // the shell has exec'd its environment
			start := time.Now()
			if n := f.m.AwaitOrphanPlugins(context.Background(), id); n < 1 {
				t.Fatalf("found %d plugins of the pod, want at least 1", n)
			}
			took := time.Since(start)
			err := <-waited
			killed := err != nil
			if killed != tt.wantKill {
				t.Fatalf("plugin killed = %v (%v) after %v, want %v", killed, err, took, tt.wantKill)
			}
			if took > 2*time.Second {
				t.Errorf("waited %v, past the 500 ms CNI timeout", took)
			}
			if n := len(pluginsOf(id)); n != 0 {
				t.Errorf("%d processes of the pod still running", n)
			}
		})
	}
	if n := (&Manager{}).AwaitOrphanPlugins(context.Background(), "no-such-pod"); n != 0 {
		t.Errorf("found %d plugins of a pod that has none", n)
	}
}
