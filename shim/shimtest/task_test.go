package shimtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	taskapi "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	tasktypes "github.com/crisp-runtime/crisp/api/containerd/types/task"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
)

// TestTaskLogsAndExitCode runs a container that writes to both streams and exits 3: the
// CRI log has each line with its stream, and Wait reports the exit code.
func TestTaskLogsAndExitCode(t *testing.T) {
	p := startPod(t)
	c := p.create(t, "logs", ctrOpts{args: []string{"sh", "-c", "echo out; echo err >&2; printf 'no newline'; exit 3"}})
	p.start(t, c)
	w := p.wait(t, c.id, "")
	if w.GetExitStatus() != 3 || w.GetExitedAt() == nil {
		t.Fatalf("wait = %v, want exit status 3", w)
	}
	got := map[string]bool{}
	for _, r := range readLog(t, c.logPath) {
		got[r.stream+" "+r.tag+" "+r.text] = true
	}
	for _, want := range []string{"stdout F out", "stderr F err", "stdout P no newline"} {
		if !got[want] {
			t.Errorf("log lacks %q; has %v", want, got)
		}
	}
	if len(got) != 3 {
		t.Errorf("log has %d records, want 3: %v", len(got), got)
	}
	st, err := p.tasks.State(ctxT(t), &taskapi.StateRequest{ID: c.id})
	if err != nil || st.GetStatus() != tasktypes.Status_STOPPED || st.GetExitStatus() != 3 || st.GetExitedAt() == nil {
		t.Errorf("state = %v, %v; want STOPPED with exit 3", st, err)
	}
	d := p.delete(t, c.id)
	if d.GetExitStatus() != 3 || d.GetPid() != uint32(c.pid) {
		t.Errorf("delete = %v, want pid %d exit 3", d, c.pid)
	}
	assertGone(t, c)
	if _, err := p.tasks.State(ctxT(t), &taskapi.StateRequest{ID: c.id}); status.Code(err) != codes.NotFound {
		t.Errorf("state after delete = %v, want NotFound", err)
	}
}

// TestTaskLifecycle follows a long-running container through created, running, SIGTERM
// and delete, and checks from the outside that nothing is left.
func TestTaskLifecycle(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	// In the pod's PID namespace sleep is not PID 1, so SIGTERM kills it (a PID 1
	// ignores signals it has no handler for).
	c := p.create(t, "sleeper", ctrOpts{args: []string{"sleep", "100"}, sharedPID: true})
	st, err := p.tasks.State(ctx, &taskapi.StateRequest{ID: c.id})
	if err != nil || st.GetStatus() != tasktypes.Status_CREATED || st.GetPid() != uint32(c.pid) {
		t.Fatalf("state after create = %v, %v; want CREATED pid %d", st, err, c.pid)
	}
	if _, err := p.tasks.Create(ctx, &taskapi.CreateTaskRequest{ID: c.id, Bundle: c.bundle}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("second create = %v, want AlreadyExists", err)
	}
	p.start(t, c)
	if _, err := p.tasks.Start(ctx, &taskapi.StartRequest{ID: c.id}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("second start = %v, want FailedPrecondition", err)
	}
	st, err = p.tasks.State(ctx, &taskapi.StateRequest{ID: c.id})
	if err != nil || st.GetStatus() != tasktypes.Status_RUNNING {
		t.Fatalf("state after start = %v, %v; want RUNNING", st, err)
	}
	// Start returns once the init has let go of the exec fifo, just before its execve.
	waitFor(t, 5*time.Second, "sleep to run", func() bool {
		return readTrim(t, fmt.Sprintf("/proc/%d/comm", c.pid)) == "sleep"
	})
	if got := memoryCgroup(t, c.pid); got != c.cgroup {
		t.Errorf("container memory cgroup = %s, want %s", got, c.cgroup)
	}
	for kind, want := range map[string]string{"net": "net", "ipc": "ipc", "uts": "uts", "pid": "pid"} {
		if nsInode(t, fmt.Sprintf("/proc/%d/ns/%s", c.pid, kind)) != nsInode(t, fmt.Sprintf("/proc/%d/ns/%s", p.pausePid, want)) {
			t.Errorf("container is not in the pod's %s namespace", kind)
		}
	}
	pids, err := p.tasks.Pids(ctx, &taskapi.PidsRequest{ID: c.id})
	if err != nil || len(pids.GetProcesses()) != 1 || pids.GetProcesses()[0].GetPid() != uint32(c.pid) {
		t.Errorf("pids = %v, %v; want [%d]", pids, err, c.pid)
	}
	conn, err := p.tasks.Connect(ctx, &taskapi.ConnectRequest{ID: c.id})
	if err != nil || conn.GetShimPid() != uint32(p.pid) || conn.GetTaskPid() != uint32(c.pid) {
		t.Errorf("connect = %v, %v", conn, err)
	}

	if _, err := p.tasks.Kill(ctx, &taskapi.KillRequest{ID: c.id, Signal: uint32(syscall.SIGTERM)}); err != nil {
		t.Fatal(err)
	}
	if w := p.wait(t, c.id, ""); w.GetExitStatus() != 143 {
		t.Errorf("wait = %v, want 143 (SIGTERM)", w)
	}
	if _, err := p.tasks.Kill(ctx, &taskapi.KillRequest{ID: c.id, Signal: uint32(syscall.SIGTERM)}); status.Code(err) != codes.NotFound {
		t.Errorf("kill after exit = %v, want NotFound", err)
	}
	if d := p.delete(t, c.id); d.GetExitStatus() != 143 || d.GetExitedAt() == nil {
		t.Errorf("delete = %v, want exit 143", d)
	}
	assertGone(t, c)
	if _, err := p.tasks.Delete(ctx, &taskapi.DeleteRequest{ID: c.id}); status.Code(err) != codes.NotFound {
		t.Errorf("second delete = %v, want NotFound", err)
	}

	// Delete of a running container kills it, in a private PID namespace too.
	c2 := p.create(t, "runner", ctrOpts{args: []string{"sh", "-c", "sleep 100 & sleep 100 & wait"}})
	p.start(t, c2)
	waitFor(t, 5*time.Second, "two processes", func() bool {
		pids, err := p.tasks.Pids(ctx, &taskapi.PidsRequest{ID: c2.id})
		return err == nil && len(pids.GetProcesses()) == 3
	})
	if d := p.delete(t, c2.id); d.GetExitStatus() != 137 {
		t.Errorf("delete of running container = %v, want exit 137", d)
	}
	assertGone(t, c2)

	// A created container that never started is deleted too.
	c3 := p.create(t, "never", ctrOpts{args: []string{"true"}})
	p.delete(t, c3.id)
	assertGone(t, c3)
}

// TestTaskExec runs processes in a running container through FIFOs and checks that
// execs leave no fd behind in the shim.
func TestTaskExec(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	c := p.create(t, "host", ctrOpts{args: []string{"sleep", "100"}})
	p.start(t, c)

	proc := func(args ...string) *specs.Process {
		return &specs.Process{Args: args, Env: []string{"PATH=/bin"}, Cwd: "/"}
	}
	// run execs args with a stdout FIFO and returns what it printed and its status.
	run := func(execID string, args ...string) (string, uint32) {
		t.Helper()
		out := fifo(t, "out")
		r := openReader(t, out)
		if _, err := p.tasks.Exec(ctx, &taskapi.ExecProcessRequest{ID: c.id, ExecID: execID, Stdout: out, Spec: processAny(t, proc(args...))}); err != nil {
			t.Fatalf("exec %s: %v", execID, err)
		}
		if _, err := p.tasks.Start(ctx, &taskapi.StartRequest{ID: c.id, ExecID: execID}); err != nil {
			t.Fatalf("start exec %s: %v", execID, err)
		}
		text := readAll(t, r, 10*time.Second)
		r.Close()
		w := p.wait(t, c.id, execID)
		if _, err := p.tasks.Delete(ctx, &taskapi.DeleteRequest{ID: c.id, ExecID: execID}); err != nil {
			t.Fatalf("delete exec %s: %v", execID, err)
		}
		os.Remove(out)
		return text, w.GetExitStatus()
	}

	if out, code := run("hi", "echo", "hi"); out != "hi\n" || code != 0 {
		t.Errorf("exec echo hi = %q, %d; want \"hi\\n\", 0", out, code)
	}
	if _, code := run("seven", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exec exit 7 = %d", code)
	}
	if out, _ := run("ns", "hostname"); out != "taskpod\n" {
		t.Errorf("exec hostname = %q, want the pod's", out)
	}

	// stdin through a FIFO; CloseIO gives the process EOF.
	in, out := fifo(t, "in"), fifo(t, "out")
	r := openReader(t, out)
	if _, err := p.tasks.Exec(ctx, &taskapi.ExecProcessRequest{ID: c.id, ExecID: "cat", Stdin: in, Stdout: out, Spec: processAny(t, proc("cat"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.tasks.Start(ctx, &taskapi.StartRequest{ID: c.id, ExecID: "cat"}); err != nil {
		t.Fatal(err)
	}
	st, err := p.tasks.State(ctx, &taskapi.StateRequest{ID: c.id, ExecID: "cat"})
	if err != nil || st.GetStatus() != tasktypes.Status_RUNNING || st.GetStdin() != in {
		t.Errorf("exec state = %v, %v", st, err)
	}
	w, err := os.OpenFile(in, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("ping\n"); err != nil {
		t.Fatal(err)
	}
	// The caller's close alone is no EOF (the shim keeps the FIFO open, so callers
	// can reconnect); CloseIO is, and what was written before still arrives.
	w.Close()
	if got := readUntil(t, r, "ping\n", 10*time.Second); got != "ping\n" {
		t.Errorf("cat echoed %q", got)
	}
	if st, _ := p.tasks.State(ctx, &taskapi.StateRequest{ID: c.id, ExecID: "cat"}); st.GetStatus() != tasktypes.Status_RUNNING {
		t.Errorf("cat stopped before CloseIO: %v", st)
	}
	if _, err := p.tasks.CloseIO(ctx, &taskapi.CloseIORequest{ID: c.id, ExecID: "cat", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, r, 10*time.Second); got != "" {
		t.Errorf("cat echoed %q more", got)
	}
	if ws := p.wait(t, c.id, "cat"); ws.GetExitStatus() != 0 {
		t.Errorf("cat exit = %d", ws.GetExitStatus())
	}
	if _, err := p.tasks.Delete(ctx, &taskapi.DeleteRequest{ID: c.id, ExecID: "cat"}); err != nil {
		t.Fatal(err)
	}

	// Kill of a running exec; errors for unknown and duplicate ids.
	if _, err := p.tasks.Exec(ctx, &taskapi.ExecProcessRequest{ID: c.id, ExecID: "long", Spec: processAny(t, proc("sleep", "100"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.tasks.Exec(ctx, &taskapi.ExecProcessRequest{ID: c.id, ExecID: "long", Spec: processAny(t, proc("true"))}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("duplicate exec = %v, want AlreadyExists", err)
	}
	if _, err := p.tasks.Start(ctx, &taskapi.StartRequest{ID: c.id, ExecID: "long"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.tasks.Kill(ctx, &taskapi.KillRequest{ID: c.id, ExecID: "long", Signal: uint32(syscall.SIGKILL)}); err != nil {
		t.Fatal(err)
	}
	if ws := p.wait(t, c.id, "long"); ws.GetExitStatus() != 137 {
		t.Errorf("killed exec exit = %d, want 137", ws.GetExitStatus())
	}
	if _, err := p.tasks.Delete(ctx, &taskapi.DeleteRequest{ID: c.id, ExecID: "long"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.tasks.State(ctx, &taskapi.StateRequest{ID: c.id, ExecID: "long"}); status.Code(err) != codes.NotFound {
		t.Errorf("state of deleted exec = %v, want NotFound", err)
	}
	if _, err := p.tasks.Exec(ctx, &taskapi.ExecProcessRequest{ID: c.id, ExecID: "bad", Spec: &anypb.Any{TypeUrl: "x", Value: []byte("{}")}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("exec with a bad spec = %v, want InvalidArgument", err)
	}

	// 100 execs later the shim holds as many fds and threads as before.
	fdDir, taskDir := fmt.Sprintf("/proc/%d/fd", p.pid), fmt.Sprintf("/proc/%d/task", p.pid)
	fds, threads := countDir(t, fdDir), countDir(t, taskDir)
	for i := range 100 {
		if out, code := run("loop"+strconv.Itoa(i), "echo", strconv.Itoa(i)); out != strconv.Itoa(i)+"\n" || code != 0 {
			t.Fatalf("exec %d = %q, %d", i, out, code)
		}
	}
	if got := countDir(t, fdDir); got != fds {
		t.Errorf("shim fds: %d before 100 execs, %d after", fds, got)
	}
	if got := countDir(t, taskDir); got > threads+2 {
		t.Errorf("shim threads: %d before 100 execs, %d after", threads, got)
	}
	p.delete(t, c.id)
	assertGone(t, c)
}

// TestTaskOOM limits a container to 16 MiB and lets a shell grow a string until the OOM
// killer ends it.
func TestTaskOOM(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	c := p.create(t, "hog", ctrOpts{args: []string{"sh", "-c", "x=a; while true; do x=$x$x; done"}, memory: 16 << 20})
	ok := p.create(t, "fine", ctrOpts{args: []string{"true"}})
	p.start(t, c)
	p.start(t, ok)
	if w := p.wait(t, c.id, ""); w.GetExitStatus() != 137 {
		t.Errorf("hog exit = %d, want 137", w.GetExitStatus())
	}
	p.wait(t, ok.id, "")
	for id, want := range map[string]bool{c.id: true, ok.id: false} {
		info, err := p.extra.ContainerInfo(ctx, &optionsv1.ContainerInfoRequest{ContainerId: id})
		if err != nil || info.GetOomKilled() != want {
			t.Errorf("ContainerInfo(%s) = %v, %v; want oom_killed %v", id, info, err, want)
		}
	}
	if _, err := p.extra.ContainerInfo(ctx, &optionsv1.ContainerInfoRequest{ContainerId: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("ContainerInfo of unknown = %v, want NotFound", err)
	}
	p.delete(t, c.id)
	p.delete(t, ok.id)
	assertGone(t, c)
}

// TestTaskTerminal runs a container on a pty: its output is logged as stdout.
func TestTaskTerminal(t *testing.T) {
	p := startPod(t)
	c := p.create(t, "tty", ctrOpts{args: []string{"sh", "-c", "[ -t 1 ] && echo is-a-tty; echo to-stderr >&2; stty size"}, terminal: true})
	if _, err := p.tasks.ResizePty(ctxT(t), &taskapi.ResizePtyRequest{ID: c.id, Width: 100, Height: 40}); err != nil {
		t.Fatalf("resize: %v", err)
	}
	p.start(t, c)
	if w := p.wait(t, c.id, ""); w.GetExitStatus() != 0 {
		t.Errorf("exit = %d", w.GetExitStatus())
	}
	var got []string
	for _, r := range readLog(t, c.logPath) {
		got = append(got, r.stream+" "+r.tag+" "+r.text)
	}
	want := []string{"stdout F is-a-tty", "stdout F to-stderr", "stdout F 40 100"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("log = %q, want %q", got, want)
	}
	p.delete(t, c.id)
	assertGone(t, c)

	// An exec on a terminal: output through the stdout FIFO, resizable.
	h := p.create(t, "tty-host", ctrOpts{args: []string{"sleep", "100"}})
	p.start(t, h)
	ctx := ctxT(t)
	out := fifo(t, "out")
	r := openReader(t, out)
	spec := &specs.Process{Args: []string{"sh", "-c", "sleep 0.2; [ -t 0 ] && echo tty; stty size"}, Env: []string{"PATH=/bin"}, Cwd: "/"}
	if _, err := p.tasks.Exec(ctx, &taskapi.ExecProcessRequest{ID: h.id, ExecID: "t", Terminal: true, Stdout: out, Spec: processAny(t, spec)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.tasks.Start(ctx, &taskapi.StartRequest{ID: h.id, ExecID: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.tasks.ResizePty(ctx, &taskapi.ResizePtyRequest{ID: h.id, ExecID: "t", Width: 81, Height: 21}); err != nil {
		t.Fatalf("resize exec pty: %v", err)
	}
	if got := strings.ReplaceAll(readUntil(t, r, "21 81\n", 10*time.Second), "\r", ""); got != "tty\n21 81\n" {
		t.Errorf("exec on a terminal printed %q", got)
	}
	if w := p.wait(t, h.id, "t"); w.GetExitStatus() != 0 {
		t.Errorf("terminal exec exit = %d", w.GetExitStatus())
	}
	if _, err := p.tasks.ResizePty(ctx, &taskapi.ResizePtyRequest{ID: h.id, Width: 1, Height: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("resize without a terminal = %v, want FailedPrecondition", err)
	}
	p.delete(t, h.id)
}

// TestTaskStdio runs a container whose stdin and stdout are the caller's FIFOs (no log
// path: a containerd-style caller copies the output itself).
func TestTaskStdio(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	c, req := p.prepare(t, "io", ctrOpts{args: []string{"sh", "-c", "read x; echo got-$x; echo err >&2"}, noLog: true})
	req.Stdin, req.Stdout, req.Stderr = fifo(t, "in"), fifo(t, "out"), fifo(t, "err")
	outR, errR := openReader(t, req.Stdout), openReader(t, req.Stderr)
	resp, err := p.tasks.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	c.pid = int(resp.GetPid())
	p.start(t, c)
	w, err := os.OpenFile(req.Stdin, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("abc\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if got := readAll(t, outR, 10*time.Second); got != "got-abc\n" {
		t.Errorf("stdout = %q", got)
	}
	if got := readAll(t, errR, 10*time.Second); got != "err\n" {
		t.Errorf("stderr = %q", got)
	}
	if ws := p.wait(t, c.id, ""); ws.GetExitStatus() != 0 {
		t.Errorf("exit = %d", ws.GetExitStatus())
	}
	if _, err := p.extra.ReopenLog(ctx, &optionsv1.ReopenLogRequest{ContainerId: c.id}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("reopen without a log = %v, want FailedPrecondition", err)
	}
	p.delete(t, c.id)
	assertGone(t, c)
}

// TestTaskReopenLog renames the log file as kubelet's rotation does: after ReopenLog new
// lines go to a fresh file at the log path.
func TestTaskReopenLog(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	c := p.create(t, "chatty", ctrOpts{args: []string{"sh", "-c", "i=0; while true; do echo line$i; i=$((i+1)); sleep 0.02; done"}})
	p.start(t, c)
	waitFor(t, 5*time.Second, "log lines", func() bool { return len(readLog(t, c.logPath)) >= 3 })
	rotated := c.logPath + ".20260701-000000"
	if err := os.Rename(c.logPath, rotated); err != nil {
		t.Fatal(err)
	}
	if _, err := p.extra.ReopenLog(ctx, &optionsv1.ReopenLogRequest{ContainerId: c.id}); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	waitFor(t, 5*time.Second, "lines in the new file", func() bool {
		_, err := os.Stat(c.logPath)
		return err == nil && len(readLog(t, c.logPath)) >= 3
	})
	old := readLog(t, rotated)
	time.Sleep(100 * time.Millisecond)
	if again := readLog(t, rotated); len(again) != len(old) {
		t.Errorf("rotated file still grows: %d then %d lines", len(old), len(again))
	}
	fresh := readLog(t, c.logPath)
	if n, _ := strconv.Atoi(strings.TrimPrefix(fresh[0].text, "line")); fresh[0].text != fmt.Sprintf("line%d", len(old)) && n < len(old) {
		t.Errorf("new file starts with %q after %d old lines", fresh[0].text, len(old))
	}
	if _, err := p.extra.ReopenLog(ctx, &optionsv1.ReopenLogRequest{ContainerId: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("reopen of unknown = %v, want NotFound", err)
	}
	p.delete(t, c.id)
	if _, err := p.extra.ReopenLog(ctx, &optionsv1.ReopenLogRequest{ContainerId: c.id}); status.Code(err) != codes.NotFound {
		t.Errorf("reopen after delete = %v, want NotFound", err)
	}
}

// TestTaskV2 drives a container through containerd.task.v2.Task.
func TestTaskV2(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	// containerd's v2 client would link its own copy of the containerd.types protos
	// next to the shim's; v2 is the v3 file under another service name, so call it with
	// the v3 messages, as a v2 client's bytes are the same.
	v2 := func(method string, req, resp proto.Message) error {
		return p.client.Call(ctx, "containerd.task.v2.Task", method, req, resp)
	}
	c, req := p.prepare(t, "v2", ctrOpts{args: []string{"sh", "-c", "echo via-v2; exit 5"}})
	created := &taskapi.CreateTaskResponse{}
	if err := v2("Create", &taskapi.CreateTaskRequest{ID: req.ID, Bundle: req.Bundle, Rootfs: req.Rootfs, Options: req.Options}, created); err != nil {
		t.Fatalf("v2 create: %v", err)
	}
	c.pid = int(created.GetPid())
	if err := v2("Start", &taskapi.StartRequest{ID: c.id}, &taskapi.StartResponse{}); err != nil {
		t.Fatal(err)
	}
	w := &taskapi.WaitResponse{}
	if err := v2("Wait", &taskapi.WaitRequest{ID: c.id}, w); err != nil || w.GetExitStatus() != 5 {
		t.Fatalf("v2 wait = %v, %v; want 5", w, err)
	}
	st := &taskapi.StateResponse{}
	err := v2("State", &taskapi.StateRequest{ID: c.id}, st)
	if err != nil || st.GetStatus() != tasktypes.Status_STOPPED || st.GetPid() != uint32(c.pid) {
		t.Errorf("v2 state = %v, %v", st, err)
	}
	if recs := readLog(t, c.logPath); len(recs) != 1 || recs[0].text != "via-v2" {
		t.Errorf("log = %v", recs)
	}
	if err := v2("Shutdown", &taskapi.ShutdownRequest{ID: c.id}, &emptypb.Empty{}); err != nil {
		t.Errorf("v2 shutdown: %v", err)
	}
	if err := v2("Delete", &taskapi.DeleteRequest{ID: c.id}, &taskapi.DeleteResponse{}); err != nil {
		t.Fatal(err)
	}
	assertGone(t, c)
	// Task Shutdown must not end the shim: the sandbox owns it.
	if !alive(p.pid) {
		t.Fatal("task Shutdown stopped the shim")
	}
	if _, err := p.sb.PingSandbox(ctx, &sandboxapi.PingRequest{SandboxID: p.id}); err != nil {
		t.Errorf("ping after task shutdown: %v", err)
	}
	// Stats is served over v2 too (TestTaskStats checks its figures); a deleted
	// container has none.
	if err := v2("Stats", &taskapi.StatsRequest{ID: c.id}, &taskapi.StatsResponse{}); status.Code(err) != codes.NotFound {
		t.Errorf("v2 stats of a deleted container = %v, want NotFound", err)
	}
}

// TestTaskUpdate changes the memory limit of a running container.
func TestTaskUpdate(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	c := p.create(t, "upd", ctrOpts{args: []string{"sleep", "100"}, memory: 64 << 20})
	p.start(t, c)
	limit := "/sys/fs/cgroup/memory" + c.cgroup + "/memory.limit_in_bytes"
	if got := readTrim(t, limit); got != strconv.Itoa(64<<20) {
		t.Fatalf("limit = %s", got)
	}
	res := []byte(`{"memory":{"limit":33554432},"cpu":{"shares":512}}`)
	if _, err := p.tasks.Update(ctx, &taskapi.UpdateTaskRequest{ID: c.id, Resources: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources", Value: res}}); err != nil {
		t.Fatalf("update: %v", err)
	}
	if got := readTrim(t, limit); got != strconv.Itoa(32<<20) {
		t.Errorf("limit after update = %s, want %d", got, 32<<20)
	}
	if got := readTrim(t, "/sys/fs/cgroup/cpu"+c.cgroup+"/cpu.shares"); got != "512" {
		t.Errorf("cpu.shares after update = %s", got)
	}
	// Execs still start after an update (libcontainer refuses while devices are skipped).
	if _, err := p.tasks.Exec(ctx, &taskapi.ExecProcessRequest{ID: c.id, ExecID: "after", Spec: processAny(t, &specs.Process{Args: []string{"true"}, Env: []string{"PATH=/bin"}, Cwd: "/"})}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.tasks.Start(ctx, &taskapi.StartRequest{ID: c.id, ExecID: "after"}); err != nil {
		t.Fatalf("exec after update: %v", err)
	}
	p.wait(t, c.id, "after")
	p.delete(t, c.id)
	assertGone(t, c)
}

// TestTaskShutdownSandboxDeletesContainers checks that ShutdownSandbox kills and deletes
// the pod's containers before the shim exits.
func TestTaskShutdownSandboxDeletesContainers(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	a := p.create(t, "a", ctrOpts{args: []string{"sleep", "100"}})
	b := p.create(t, "b", ctrOpts{args: []string{"sleep", "100"}, sharedPID: true})
	p.start(t, a)
	if _, err := p.sb.ShutdownSandbox(ctx, &sandboxapi.ShutdownSandboxRequest{SandboxID: p.id}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, p.pid)
	for _, c := range []*ctr{a, b} {
		waitGone(t, c.pid)
		assertGone(t, c)
	}
}

// TestTaskSIGTERMDeletesContainers checks that SIGTERM to the shim cleans up the
// containers as ShutdownSandbox does.
func TestTaskSIGTERMDeletesContainers(t *testing.T) {
	p := startPod(t)
	c := p.create(t, "victim", ctrOpts{args: []string{"sleep", "100"}})
	p.start(t, c)
	if err := syscall.Kill(p.pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, p.pid)
	waitGone(t, c.pid)
	assertGone(t, c)
	if _, err := os.Stat(filepath.Join(p.bundle, "libcontainer", c.id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("libcontainer state of the container remains: %v", err)
	}
}

// TestTaskLatencyAndMemory measures create+start of a container (p50 of 20) and the
// shim's memory with 1 and with 10 containers running. The numbers are logged (go test
// -v) for the record; the bounds are sanity limits.
func TestTaskLatencyAndMemory(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	rss, pss, anon := memUse(t, p.pid)
	t.Logf("shim with a started sandbox, before any container: RSS %.2f MiB, PSS %.2f MiB, Anon %.2f MiB", float64(rss)/1024, float64(pss)/1024, float64(anon)/1024)
	var lat []time.Duration
	for i := range 20 {
		id := "lat" + strconv.Itoa(i)
		c, req := p.prepare(t, id, ctrOpts{args: []string{"true"}})
		start := time.Now()
		resp, err := p.tasks.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		p.start(t, c)
		lat = append(lat, time.Since(start))
		c.pid = int(resp.GetPid())
		p.wait(t, id, "")
		p.delete(t, id)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("create+start over 20 containers: p50 %v, min %v, max %v", lat[10], lat[0], lat[19])
	if lat[10] > time.Second {
		t.Errorf("create+start p50 %v is far beyond any sane bound", lat[10])
	}

	time.Sleep(1500 * time.Millisecond)
	rss0, pss0, anon0 := memUse(t, p.pid)
	var ctrs []*ctr
	measure := func(n int) {
		for len(ctrs) < n {
			c := p.create(t, "mem"+strconv.Itoa(len(ctrs)), ctrOpts{args: []string{"sleep", "100"}})
			p.start(t, c)
			ctrs = append(ctrs, c)
		}
		// The shim returns freed memory a second after its last event.
		time.Sleep(1500 * time.Millisecond)
		rss, pss, anon := memUse(t, p.pid)
		t.Logf("shim with %d running containers: RSS %.2f MiB, PSS %.2f MiB, Anon %.2f MiB, threads %d, fds %d (none running: RSS %.2f, PSS %.2f, Anon %.2f MiB)",
			n, float64(rss)/1024, float64(pss)/1024, float64(anon)/1024, countDir(t, fmt.Sprintf("/proc/%d/task", p.pid)), countDir(t, fmt.Sprintf("/proc/%d/fd", p.pid)),
			float64(rss0)/1024, float64(pss0)/1024, float64(anon0)/1024)
		if pss > 64<<10 {
			t.Errorf("shim PSS %d KiB is beyond any sane bound", pss)
		}
	}
	measure(1)
	measure(10)
	for _, c := range ctrs {
		p.delete(t, c.id)
		assertGone(t, c)
	}
}

// TestTaskCreateErrors checks that bad requests fail with the right code and leave no
// mount behind.
func TestTaskCreateErrors(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	c, req := p.prepare(t, "bad", ctrOpts{args: []string{"true"}})
	bad := func(name string, code codes.Code, mutate func(r *taskapi.CreateTaskRequest)) {
		t.Helper()
		r := &taskapi.CreateTaskRequest{ID: req.ID, Bundle: req.Bundle, Rootfs: req.Rootfs, Options: req.Options}
		mutate(r)
		if _, err := p.tasks.Create(ctx, r); status.Code(err) != code {
			t.Errorf("%s: create = %v, want %v", name, err, code)
		}
		if mounted(t, c.rootfs) {
			t.Fatalf("%s: a failed create left %s mounted", name, c.rootfs)
		}
	}
	bad("bad id", codes.InvalidArgument, func(r *taskapi.CreateTaskRequest) { r.ID = "a/b" })
	bad("relative bundle", codes.InvalidArgument, func(r *taskapi.CreateTaskRequest) { r.Bundle = "bundle" })
	bad("no config.json", codes.InvalidArgument, func(r *taskapi.CreateTaskRequest) { r.Bundle = t.TempDir() })
	bad("wrong options", codes.InvalidArgument, func(r *taskapi.CreateTaskRequest) {
		r.Options = optionsAny(t, &optionsv1.SandboxOptions{})
	})
	bad("other sandbox", codes.InvalidArgument, func(r *taskapi.CreateTaskRequest) {
		a, _ := anypb.New(&optionsv1.ContainerOptions{SandboxId: "someone-else"})
		r.Options = a
	})
	bad("missing program", codes.Internal, func(r *taskapi.CreateTaskRequest) {
		spec := p.containerSpec(r.ID, ctrOpts{args: []string{"/no/such/program"}})
		writeSpec(t, r.Bundle, spec)
	})
	// A stale state dir without state.json (a shim killed mid-start) does not block
	// the id.
	stale := filepath.Join(p.bundle, "libcontainer", "stale")
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	sc := p.create(t, "stale", ctrOpts{args: []string{"true"}})
	p.start(t, sc)
	p.wait(t, sc.id, "")
	p.delete(t, sc.id)
	assertGone(t, sc)
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir of a deleted container remains: %v", err)
	}
}

// TestTaskWaitCancelled checks that a Wait whose context ends returns instead of hanging.
func TestTaskWaitCancelled(t *testing.T) {
	p := startPod(t)
	c := p.create(t, "w", ctrOpts{args: []string{"sleep", "100"}})
	p.start(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := p.tasks.Wait(ctx, &taskapi.WaitRequest{ID: c.id}); err == nil {
		t.Fatal("wait returned while the container runs")
	}
	p.delete(t, c.id)
	assertGone(t, c)
}
