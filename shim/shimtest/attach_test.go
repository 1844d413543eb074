package shimtest

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	taskapi "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	tasktypes "github.com/crisp-runtime/crisp/api/containerd/types/task"
	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
)

// stdinMarker is what the controller sends as CreateTaskRequest.stdin for a container
// with stdin: not a FIFO, so the shim keeps a pipe of its own.
const stdinMarker = "stdin"

// createWithStdin creates a container whose init gets a stdin the shim keeps open.
func (p *pod) createWithStdin(t *testing.T, id string, o ctrOpts) *ctr {
	t.Helper()
	c, req := p.prepare(t, id, o)
	req.Stdin = stdinMarker
	resp, err := p.tasks.Create(ctxT(t), req)
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	c.pid = int(resp.GetPid())
	return c
}

// attachSession is the caller's side of one attach: the ends of its FIFOs.
type attachSession struct {
	in  *os.File // nil without stdin
	out *os.File // nil without stdout
}

// attach creates FIFOs, opens the output's read end, attaches and opens stdin's write end.
func (p *pod) attach(t *testing.T, id string, stdin, stdout bool) *attachSession {
	t.Helper()
	req := &optionsv1.AttachRequest{ContainerId: id}
	s := &attachSession{}
	if stdout {
		req.Stdout = fifo(t, "out")
		s.out = openReader(t, req.Stdout)
	}
	if stdin {
		req.Stdin = fifo(t, "in")
	}
	if _, err := p.extra.Attach(ctxT(t), req); err != nil {
		t.Fatalf("attach %s: %v", id, err)
	}
	if stdin {
		// The shim opened the read end before Attach returned: this does not block.
		f, err := os.OpenFile(req.Stdin, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		s.in = f
	}
	return s
}

func (s *attachSession) write(t *testing.T, text string) {
	t.Helper()
	if _, err := s.in.WriteString(text); err != nil {
		t.Fatalf("write attach stdin: %v", err)
	}
}

func (s *attachSession) close() {
	if s.in != nil {
		s.in.Close()
	}
	if s.out != nil {
		s.out.Close()
	}
}

func fdCount(t *testing.T, pid int) int {
	t.Helper()
	return countDir(t, fmt.Sprintf("/proc/%d/fd", pid))
}

func logTexts(t *testing.T, path string) []string {
	t.Helper()
	var texts []string
	for _, r := range readLog(t, path) {
		texts = append(texts, r.stream+" "+r.text)
	}
	return texts
}

func hasLine(t *testing.T, path, line string) bool {
	t.Helper()
	for _, s := range logTexts(t, path) {
		if s == line {
			return true
		}
	}
	return false
}

// TestTaskAttach attaches to `cat` with stdin: what a session writes comes back to it
// and to every other session, the log gets it too, closing a session's stdin does not
// end the container's, and sessions leave no fd behind.
func TestTaskAttach(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	c := p.createWithStdin(t, "cat", ctrOpts{args: []string{"cat"}})

	// Not running yet, and unknown.
	out := fifo(t, "early")
	openReader(t, out)
	if _, err := p.extra.Attach(ctx, &optionsv1.AttachRequest{ContainerId: c.id, Stdout: out}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("attach before start = %v, want FailedPrecondition", err)
	}
	if _, err := p.extra.Attach(ctx, &optionsv1.AttachRequest{ContainerId: "nope", Stdout: out}); status.Code(err) != codes.NotFound {
		t.Errorf("attach to unknown = %v, want NotFound", err)
	}
	p.start(t, c)

	a := p.attach(t, c.id, true, true)
	a.write(t, "hello\n")
	if got := readUntil(t, a.out, "hello\n", 10*time.Second); got != "hello\n" {
		t.Errorf("attach stdout = %q, want %q", got, "hello\n")
	}
	waitFor(t, 5*time.Second, "hello in the log", func() bool { return hasLine(t, c.logPath, "stdout hello") })

	// Two sessions at once both get the output.
	b := p.attach(t, c.id, false, true)
	a.write(t, "both\n")
	for name, s := range map[string]*attachSession{"a": a, "b": b} {
		if got := readUntil(t, s.out, "both\n", 10*time.Second); got != "both\n" {
			t.Errorf("session %s got %q", name, got)
		}
	}
	// Closing a session's stdin is not the container's EOF.
	a.close()
	time.Sleep(200 * time.Millisecond)
	if st, err := p.tasks.State(ctx, &taskapi.StateRequest{ID: c.id}); err != nil || st.GetStatus() != tasktypes.Status_RUNNING {
		t.Fatalf("after a session closed its stdin: state %v, %v", st.GetStatus(), err)
	}
	in := p.attach(t, c.id, true, false)
	in.write(t, "again\n")
	if got := readUntil(t, b.out, "again\n", 10*time.Second); got != "again\n" {
		t.Errorf("session b got %q after a's end", got)
	}
	in.close()
	b.close()

	// 50 sessions leave the shim's fd count as it was.
	time.Sleep(200 * time.Millisecond)
	before := fdCount(t, p.pid)
	for i := range 50 {
		s := p.attach(t, c.id, true, true)
		line := fmt.Sprintf("session-%d\n", i)
		s.write(t, line)
		if got := readUntil(t, s.out, line, 10*time.Second); got != line {
			t.Fatalf("session %d got %q", i, got)
		}
		s.close()
	}
	var after int
	waitFor(t, 10*time.Second, "the shim's fds back to "+fmt.Sprint(before), func() bool {
		after = fdCount(t, p.pid)
		return after == before
	})
	recs := logTexts(t, c.logPath)
	want := []string{"stdout hello", "stdout both", "stdout again"}
	for i := range 50 {
		want = append(want, fmt.Sprintf("stdout session-%d", i))
	}
	if strings.Join(recs, "|") != strings.Join(want, "|") {
		t.Errorf("log = %q, want %q", recs, want)
	}

	// A session open when the container exits sees EOF; later ones are refused.
	last := p.attach(t, c.id, false, true)
	if _, err := p.tasks.Kill(ctx, &taskapi.KillRequest{ID: c.id, Signal: 9}); err != nil {
		t.Fatal(err)
	}
	p.wait(t, c.id, "")
	if got := readAll(t, last.out, 10*time.Second); got != "" {
		t.Errorf("session open at exit read %q", got)
	}
	if _, err := p.extra.Attach(ctx, &optionsv1.AttachRequest{ContainerId: c.id, Stdout: out}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("attach after exit = %v, want FailedPrecondition", err)
	}
	p.delete(t, c.id)
	assertGone(t, c)
}

// TestTaskAttachSlowReader attaches a session that never reads while the container
// writes more than its FIFO holds: the container is not blocked, the log gets every
// line, and the session is dropped (its reader sees EOF).
func TestTaskAttachSlowReader(t *testing.T) {
	p := startPod(t)
	const lines = 20000
	script := fmt.Sprintf("read x; i=0; while [ $i -lt %d ]; do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; echo done; sleep 100", lines)
	c := p.createWithStdin(t, "flood", ctrOpts{args: []string{"sh", "-c", script}})
	p.start(t, c)
	slow := p.attach(t, c.id, false, true)
	trigger := p.attach(t, c.id, true, false)
	trigger.write(t, "go\n")
	waitFor(t, 30*time.Second, "every line in the log", func() bool { return hasLine(t, c.logPath, "stdout done") })
	if n := len(readLog(t, c.logPath)); n != lines+1 {
		t.Errorf("log has %d lines, want %d", n, lines+1)
	}
	got := readAll(t, slow.out, 10*time.Second)
	if len(got) == 0 || len(got) > 2<<20 || !strings.HasPrefix(got, "line-0-") {
		t.Errorf("the slow session read %d bytes (%.40q)", len(got), got)
	}
	if st, err := p.tasks.State(ctxT(t), &taskapi.StateRequest{ID: c.id}); err != nil || st.GetStatus() != tasktypes.Status_RUNNING {
		t.Errorf("state %v, %v; want running", st.GetStatus(), err)
	}
	p.delete(t, c.id)
	assertGone(t, c)
}

// TestTaskAttachTerminal attaches to a terminal container with stdin: input goes to the
// pty, output (the echo included) comes to stdout, and ResizePty of the init works.
func TestTaskAttachTerminal(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	c := p.createWithStdin(t, "tty", ctrOpts{args: []string{"sh", "-c", "read l; echo got-$l; stty size; sleep 100"}, terminal: true})
	p.start(t, c)
	a := p.attach(t, c.id, true, true)
	if _, err := p.tasks.ResizePty(ctx, &taskapi.ResizePtyRequest{ID: c.id, Width: 100, Height: 40}); err != nil {
		t.Fatalf("resize: %v", err)
	}
	a.write(t, "hi\n")
	got := strings.ReplaceAll(readUntil(t, a.out, "40 100\n", 10*time.Second), "\r", "")
	if !strings.Contains(got, "got-hi\n40 100\n") {
		t.Errorf("terminal session read %q", got)
	}
	waitFor(t, 5*time.Second, "the log", func() bool { return hasLine(t, c.logPath, "stdout 40 100") })
	if !hasLine(t, c.logPath, "stdout got-hi") {
		t.Errorf("log = %q", logTexts(t, c.logPath))
	}
	// A container without stdin takes no attach stdin.
	n := p.create(t, "nostdin", ctrOpts{args: []string{"sleep", "100"}})
	p.start(t, n)
	in := fifo(t, "in")
	if _, err := p.extra.Attach(ctx, &optionsv1.AttachRequest{ContainerId: n.id, Stdin: in}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("attach stdin without stdin = %v, want FailedPrecondition", err)
	}
	a.close()
	p.delete(t, c.id)
	p.delete(t, n.id)
	assertGone(t, c)
}
