package spawn

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/proc"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// parentEnv makes the test binary a parent process for TestChildDiesWithProcess: it
// starts a child with Pdeathsig through Start, prints its pid, and exits when its
// stdin closes.
const parentEnv = "SPAWN_TEST_PARENT"

func TestMain(m *testing.M) {
	if os.Getenv(parentEnv) != "" {
		os.Exit(parent())
	}
	os.Exit(m.Run())
}

func parent() int {
	cmd := sleeper()
	if err := Start(cmd); err != nil {
		fmt.Fprintln(os.Stderr, "start:", err)
		return 1
	}
	fmt.Println(cmd.Process.Pid)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// sleeper is a child that runs for a minute unless it is killed, and is killed when
// its parent thread ends.
func sleeper() *exec.Cmd {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// startFromEndingThread starts cmd with start from a goroutine that locks its thread
// and returns without unlocking it, and waits until the runtime has ended that thread.
func startFromEndingThread(t *testing.T, start func(*exec.Cmd) error, cmd *exec.Cmd) {
	t.Helper()
	type started struct {
		tid int
		err error
	}
	c := make(chan started, 1)
	var s started
	for s.tid == 0 {
		go func() {
			runtime.LockOSThread()
			if tid := unix.Gettid(); tid == os.Getpid() {
				// The runtime never ends the main thread: try another.
				runtime.UnlockOSThread()
				c <- started{}
				return
			}
			c <- started{unix.Gettid(), start(cmd)}
		}()
		s = <-c
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	task := fmt.Sprintf("/proc/self/task/%d", s.tid)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d of the starting goroutine still there 5s after it returned", s.tid)
		}
	}
}

// exitedWithin reports whether the process pid, which started at startTime, is gone
// (a zombie counts) within d.
func exitedWithin(t *testing.T, pid int, startTime uint64, d time.Duration) bool {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		alive, err := proc.Alive(pid, startTime)
		if err != nil {
			t.Fatal(err)
		}
		if !alive {
			return true
		}
	}
	return false
}

// A child started through Start lives on when the thread of the goroutine that asked
// for it ends; one forked by that goroutine itself (exec.Cmd.Start) is killed then,
// which is the hazard this package exists for, and shows the test can tell.
func TestStartOutlivesCallerThread(t *testing.T) {
	for _, tt := range []struct {
		name   string
		start  func(*exec.Cmd) error
		killed bool
	}{
		{"spawn.Start", Start, false},
		{"exec.Cmd.Start on the ending thread", (*exec.Cmd).Start, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := sleeper()
			startFromEndingThread(t, tt.start, cmd)
			st, err := proc.ReadStat(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if gone := exitedWithin(t, cmd.Process.Pid, st.StartTime, 300*time.Millisecond); gone != tt.killed {
				t.Fatalf("child gone after its starter's thread ended: %v, want %v (wait: %v)", gone, tt.killed, cmd.Wait())
			}
		})
	}
}

// A child started through Start still dies with crisp's process.
func TestChildDiesWithProcess(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), parentEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("read the child's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	st, err := proc.ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = proc.KillVerified(pid, st.StartTime, 5*time.Second) })
	if exitedWithin(t, pid, st.StartTime, 300*time.Millisecond) {
		t.Fatal("child gone while its parent process runs")
	}
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("parent process: %v", err)
	}
	if !exitedWithin(t, pid, st.StartTime, 5*time.Second) {
		t.Fatal("child still running 5s after its parent process exited")
	}
}

// Every start runs on one thread, which is not the caller's.
func TestOneThread(t *testing.T) {
	tids := make(map[int]bool)
	for range 3 {
		var tid int
		if err := Do(func() error { tid = unix.Gettid(); return nil }); err != nil {
			t.Fatal(err)
		}
		tids[tid] = true
	}
	if len(tids) != 1 {
		t.Fatalf("starts ran on threads %v, want one", tids)
	}
}

// Do gives back start's error, and a start's panic to its caller, with the spawn
// thread still serving afterwards.
func TestDoErrorAndPanic(t *testing.T) {
	want := errors.New("no such binary")
	if err := Do(func() error { return want }); err != want {
		t.Fatalf("Do = %v, want %v", err, want)
	}
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the start's panic", v)
			}
		}()
		_ = Do(func() error { panic("boom") })
	}()
	if err := Do(func() error { return nil }); err != nil {
		t.Fatalf("Do after a panic: %v", err)
	}
}

// pdeathsigSet finds a Pdeathsig being given a value in Go source.
var pdeathsigSet = regexp.MustCompile(`Pdeathsig\s*(:|=)`)

// Every file of crisp that sets a Pdeathsig starts through this package: a start from
// any other goroutine may land on a thread the runtime ends early.
func TestPdeathsigUsersStartHere(t *testing.T) {
	root := testutil.RepoRoot()
	var found int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "vendor" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !pdeathsigSet.Match(src) {
			return nil
		}
		found++
		if !bytes.Contains(src, []byte("spawn.Start(")) && !bytes.Contains(src, []byte("spawn.Do(")) {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s sets a Pdeathsig but does not start through spawn.Start or spawn.Do", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no file sets a Pdeathsig: the pattern no longer matches crisp's code")
	}
}
