package task

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/containerd/errdefs"

	taskv3 "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/fifoio"
	"github.com/crisp-runtime/crisp/pkg/shimkit/reaper"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"abc": true, "a-b_c.d+e": true, strings.Repeat("x", 128): true,
		"": false, "a/b": false, "..x/": false, "a b": false, strings.Repeat("x", 129): false,
	} {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestExitStatus(t *testing.T) {
	run := func(args ...string) unix.WaitStatus {
		cmd := exec.Command(args[0], args[1:]...)
		_ = cmd.Run()
		return unix.WaitStatus(cmd.ProcessState.Sys().(syscall.WaitStatus))
	}
	if got := exitStatus(run("/bin/sh", "-c", "exit 7")); got != 7 {
		t.Errorf("exit 7 = %d", got)
	}
	if got := exitStatus(run("/bin/sh", "-c", "kill -TERM $$")); got != 143 {
		t.Errorf("SIGTERM = %d, want 143", got)
	}
}

func TestWaitExited(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "sleep 0.1; exit 4")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := waitExited(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Error("waitExited returned before the exit")
	}
	// The exit was only observed, not reaped: Wait still gets the status.
	if err := cmd.Wait(); cmd.ProcessState.ExitCode() != 4 {
		t.Errorf("Wait after waitExited = %v (%d)", err, cmd.ProcessState.ExitCode())
	}
}

func TestReadOOMKills(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "memory.oom_control")
	if err := os.WriteFile(v1, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := readOOMKills(v1); err != nil || n != 3 {
		t.Errorf("v1 = %d, %v", n, err)
	}
	v2 := filepath.Join(dir, "memory.events")
	if err := os.WriteFile(v2, []byte("low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\noom_group_kill 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := readOOMKills(v2); err != nil || n != 1 {
		t.Errorf("v2 = %d, %v", n, err)
	}
	old := filepath.Join(dir, "old")
	if err := os.WriteFile(old, []byte("oom_kill_disable 0\nunder_oom 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readOOMKills(old); err == nil {
		t.Error("a file without the counter gave no error")
	}
}

// TestCopyFile copies a pipe in chunks larger than one buffer and stops at EOF.
func TestCopyFile(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data := bytes.Repeat([]byte("0123456789abcdef"), 10000)
	go func() {
		w.Write(data)
		w.Close()
	}()
	var out bytes.Buffer
	if err := fifoio.CopyFile(&out, r); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Errorf("copied %d bytes, want %d", out.Len(), len(data))
	}
}

// TestCopyFileClosed checks that closing the source ends a copy waiting for data.
func TestCopyFileClosed(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	done := make(chan error, 1)
	go func() { done <- fifoio.CopyFile(io.Discard, r) }()
	time.Sleep(50 * time.Millisecond)
	r.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("copy did not end when its source was closed")
	}
}

func stdinFIFO(t *testing.T) (path string, c *stdinCopier, r *os.File) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "in")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c, err = openStdinCopier(path)
	if err != nil {
		t.Fatal(err)
	}
	c.dst = w
	c.start()
	return path, c, r
}

// TestStdinCopierCloseInput checks CloseIO semantics: what the caller wrote before is
// delivered, then EOF; without CloseIO the caller's close alone is no EOF.
func TestStdinCopierCloseInput(t *testing.T) {
	path, c, r := stdinFIFO(t)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("hello"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// The shim's own writer keeps the stream open across the caller's reconnects.
	buf := make([]byte, 16)
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("process read %q, %v", buf[:n], err)
	}
	if err := r.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(buf); !os.IsTimeout(err) {
		t.Fatalf("read before CloseIO = %v, want to wait", err)
	}
	if err := r.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	f, err = os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(" again"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c.closeInput()
	got, err := io.ReadAll(r)
	if err != nil || string(got) != " again" {
		t.Errorf("process read %q, %v after CloseIO; want the rest, then EOF", got, err)
	}
	c.stop(discard())
}

// TestStdinCopierNoWriter closes the input of a FIFO nobody ever opened: EOF at once.
func TestStdinCopierNoWriter(t *testing.T) {
	_, c, r := stdinFIFO(t)
	c.closeInput()
	if err := r.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("read = %d, %v; want EOF", n, err)
	}
	c.stop(discard())
	select {
	case <-c.done:
	default:
		t.Error("copier still running after stop")
	}
}

// TestOpenStdioDirectFIFO checks that output FIFOs are handed to the process as they
// are (one fd for a shared stdout/stderr path) and that the shim keeps no copy.
func TestOpenStdioDirectFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	before := fdCount(t)
	lp := &Stdio{}
	s, err := openStdio(ioConfig{stdout: path, stderr: path}, lp, discard())
	if err != nil {
		t.Fatal(err)
	}
	if lp.Stdout == nil || lp.Stdout != lp.Stderr {
		t.Errorf("stdout %v, stderr %v: want the same FIFO file", lp.Stdout, lp.Stderr)
	}
	if err := s.started(); err != nil {
		t.Fatal(err)
	}
	s.close()
	if got := fdCount(t); got != before {
		t.Errorf("fds: %d before, %d after", before, got)
	}
}

func fdCount(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func TestProcessStates(t *testing.T) {
	p := newProcessState("e", ioConfig{})
	if st, _, _ := p.state(); st.String() != "CREATED" {
		t.Errorf("new = %v", st)
	}
	if err := p.signal(syscall.SIGTERM); err != errNotStarted {
		t.Errorf("signal before start = %v", err)
	}
	p.setRunning()
	at := time.Now()
	p.setExited(137, at)
	p.setRunning() // an exit recorded first wins
	st, code, exitedAt := p.state()
	if st.String() != "STOPPED" || code != 137 || !exitedAt.Equal(at.UTC()) || !p.exited() {
		t.Errorf("after exit = %v %d %v", st, code, exitedAt)
	}
}

// containerd 2.x sends its runc options (the task API address) with every container it
// creates in a shim sandbox: they stand for no options, anything else foreign is refused.
func TestUnpackOptions(t *testing.T) {
	own, err := anypb.New(&optionsv1.ContainerOptions{LogPath: "/var/log/pods/x/0.log"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		in      *anypb.Any
		wantLog string
		wantErr bool
	}{
		{"none", nil, "", false},
		{"crisp's", own, "/var/log/pods/x/0.log", false},
		{"containerd runc options", &anypb.Any{TypeUrl: "containerd.runc.v1.Options", Value: []byte{0x7a, 0x03, 'a', 'b', 'c'}}, "", false},
		{"runc options with a prefix", &anypb.Any{TypeUrl: "type.googleapis.com/containerd.runc.v1.Options"}, "", false},
		{"something else", &anypb.Any{TypeUrl: "example.com/Other"}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := unpackOptions(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && got.GetLogPath() != tt.wantLog {
				t.Fatalf("log path %q, want %q", got.GetLogPath(), tt.wantLog)
			}
		})
	}
}

// A task Shutdown ends the shim only when no task is left or being created (as
// containerd's podsandbox expects of a task shim), and only after its reply.
func TestShutdownWhenIdle(t *testing.T) {
	for _, busy := range []bool{false, true} {
		called := make(chan struct{}, 1)
		s, err := New(Config{Runner: noRunner{}, Reaper: reaper.New(discard()), Logger: discard(),
			OnIdleShutdown: func() { called <- struct{}{} }})
		if err != nil {
			t.Fatal(err)
		}
		if busy {
			s.reserved["c1"] = struct{}{}
		}
		ctx, cancel := context.WithCancel(context.Background())
		if _, err := s.Shutdown(ctx, &taskv3.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-called:
			t.Fatalf("busy=%v: the hook ran before the request ended", busy)
		case <-time.After(20 * time.Millisecond):
		}
		cancel() // the request is done: its reply is out
		select {
		case <-called:
			if busy {
				t.Fatal("a shim still creating a container shut down")
			}
		case <-time.After(time.Second):
			if !busy {
				t.Fatal("an idle shim did not shut down")
			}
		}
	}
}

// noRunner is a Runner for tests that create no container.
type noRunner struct{}

func (noRunner) Create(context.Context, *CreateRequest) (*Created, error) {
	return nil, Errorf(errdefs.ErrNotImplemented, "no runner")
}
func (noRunner) Start(context.Context, string, <-chan struct{}) error {
	return errdefs.ErrNotImplemented
}
func (noRunner) Exec(context.Context, *ExecRequest) (int, error) { return 0, errdefs.ErrNotImplemented }
func (noRunner) Update(context.Context, string, []byte) error    { return errdefs.ErrNotImplemented }
func (noRunner) Delete(context.Context, string, string) error    { return nil }
