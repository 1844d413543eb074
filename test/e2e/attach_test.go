package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/remotecommand"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// attachReturnWithin is how soon an attach whose client closed stdin must return: the
// session waits for output to pause for half a second first.
const attachReturnWithin = 5 * time.Second

// stdinCtr is a container config with stdin open for attach sessions.
func stdinCtr(name, image string, once bool, cmd ...string) *cri.ContainerConfig {
	cfg := ctrConfig(name, image, cmd...)
	cfg.Stdin, cfg.StdinOnce = true, once
	return cfg
}

// attachSession is one attach client running in the background.
type attachSession struct {
	stdin       *io.PipeWriter
	out, errOut *lineWaiter
	done        chan error
}

// attach starts an attach session with stdin, stdout and stderr (a terminal: stdin and
// stdout) on container id; a nil stdin is a pipe the test writes to.
func (e *env) attach(ctx context.Context, t *testing.T, id string, tr transport, tty bool, stdin io.Reader) *attachSession {
	t.Helper()
	return attachOn(ctx, t, e.rt, id, tr, tty, stdin)
}

// attachOn is attach through any CRI runtime service (criserver's or containerd's).
func attachOn(ctx context.Context, t *testing.T, rt cri.RuntimeServiceClient, id string, tr transport, tty bool, stdin io.Reader) *attachSession {
	t.Helper()
	resp, err := rt.Attach(ctx, &cri.AttachRequest{ContainerId: id, Stdin: true, Stdout: true, Stderr: !tty, Tty: tty})
	if err != nil {
		t.Fatalf("Attach %s: %v", id, err)
	}
	s := &attachSession{out: newLineWaiter(), errOut: newLineWaiter(), done: make(chan error, 1)}
	opts := remotecommand.StreamOptions{Stdout: s.out, Stderr: s.errOut, Tty: tty}
	if tty {
		opts.Stderr = nil
	}
	var pr *io.PipeReader
	if stdin == nil {
		pr, s.stdin = io.Pipe()
		stdin = pr
	}
	opts.Stdin = stdin
	go func() {
		err := stream(ctx, t, resp.Url, tr, opts)
		if pr != nil {
			// A write to a session that ended fails instead of blocking the test.
			pr.CloseWithError(io.ErrClosedPipe)
		}
		s.done <- err
	}()
	return s
}

// ended waits up to d for the session to return and reports how long it took.
func (s *attachSession) ended(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("attach session ended with %v (stdout %q, stderr %q)", err, s.out.String(), s.errOut.String())
		}
	case <-time.After(d):
		t.Fatalf("attach session still open after %v (stdout %q)", d, s.out.String())
	}
	return time.Since(start)
}

func (e *env) ctrState(ctx context.Context, t *testing.T, id string) cri.ContainerState {
	t.Helper()
	st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	return st.Status.State
}

func TestE2EAttach(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	// Kubelet sends no log_directory for a pod whose containers log nowhere.
	nolog := e.podConfig("attach-nolog")
	nolog.LogDirectory = ""
	nologID := e.runPod(ctx, nolog)
	logged := e.podConfig("attach-logged")
	loggedID := e.runPod(ctx, logged)
	streams := []transport{spdyTransport, wsTransport} // v4 cannot end stdin

	// Item 1: no log file, yet attach streams the output of an interactive shell.
	t.Run("without log file", func(t *testing.T) {
		for _, tr := range streams {
			cfg := stdinCtr("sh-"+string(tr), img, true, "sh")
			cfg.LogPath = ""
			id := e.runCtr(ctx, nologID, nolog, cfg)
			s := e.attach(ctx, t, id, tr, false, nil)
			if _, err := s.stdin.Write([]byte("echo hi; echo oops >&2\n")); err != nil {
				t.Fatalf("%s: write to the session: %v (%v)", tr, err, <-s.done)
			}
			if !s.out.wait("hi\n", 10*time.Second) || !s.errOut.wait("oops\n", 10*time.Second) {
				t.Fatalf("%s: stdout %q, stderr %q; want hi and oops", tr, s.out.String(), s.errOut.String())
			}
			// stdin_once: the client's EOF is the shell's, which exits, ending the session.
			s.stdin.Close()
			s.ended(t, 10*time.Second)
			if st := e.waitExit(ctx, id, 10*time.Second); st.ExitCode != 0 || st.LogPath != "" {
				t.Errorf("%s: shell exit code %d, log path %q", tr, st.ExitCode, st.LogPath)
			}
		}
	})

	// stdin_once: the session's EOF closes the container's stdin, so cat exits.
	t.Run("stdin_once closes the container's stdin", func(t *testing.T) {
		for _, tr := range streams {
			cfg := stdinCtr("cat-"+string(tr), img, true, "cat")
			cfg.LogPath = ""
			id := e.runCtr(ctx, nologID, nolog, cfg)
			s := e.attach(ctx, t, id, tr, false, strings.NewReader("meow\n"))
			s.ended(t, 10*time.Second)
			if st := e.waitExit(ctx, id, 10*time.Second); st.ExitCode != 0 {
				t.Errorf("%s: cat exit code %d", tr, st.ExitCode)
			}
			if got := s.out.String(); got != "meow\n" {
				t.Errorf("%s: cat echoed %q, want meow", tr, got)
			}
		}
	})

	// Item 2: without stdin_once the client's EOF ends the session, as `echo 'echo hi'
	// | kubectl attach -i` on containerd, and the container keeps its stdin.
	t.Run("stdin EOF ends the session", func(t *testing.T) {
		id := e.runCtr(ctx, loggedID, logged, stdinCtr("sh", img, false, "sh"))
		for i, tr := range streams {
			line := fmt.Sprintf("hi-%d", i)
			s := e.attach(ctx, t, id, tr, false, strings.NewReader("echo "+line+"\n"))
			took := s.ended(t, attachReturnWithin)
			t.Logf("%s: attach returned %v after the session started", tr, took)
			if got := s.out.String(); got != line+"\n" {
				t.Errorf("%s: stdout %q, want %q", tr, got, line)
			}
			if st := e.ctrState(ctx, t, id); st != cri.ContainerState_CONTAINER_RUNNING {
				t.Fatalf("%s: shell %v after the session, want running", tr, st)
			}
		}
		// Each session's lines reached the one shell: its stdin stayed open.
		st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(logLines(t, st.Status.LogPath), "|"); got != "stdout hi-0|stdout hi-1" {
			t.Errorf("log %q", got)
		}

		// A terminal's session ends with the client's stdin too, as on containerd.
		cfg := stdinCtr("tty", img, false, "sh")
		cfg.Tty = true
		ttyID := e.runCtr(ctx, loggedID, logged, cfg)
		s := e.attach(ctx, t, ttyID, spdyTransport, true, strings.NewReader("echo $((40+2))-tty\n"))
		s.ended(t, attachReturnWithin)
		// The answer, not the terminal's echo of the command.
		if got := s.out.String(); !strings.Contains(got, "42-tty") {
			t.Errorf("tty: output %q lacks 42-tty", got)
		}
		if st := e.ctrState(ctx, t, ttyID); st != cri.ContainerState_CONTAINER_RUNNING {
			t.Errorf("tty shell %v after the session, want running", st)
		}
	})

	e.stopRemove(ctx, t, nologID)
	e.stopRemove(ctx, t, loggedID)
	if ents, _ := os.ReadDir(filepath.Join(e.state, "attach")); len(ents) != 0 {
		t.Errorf("attach dirs left: %d", len(ents))
	}
	e.assertNodeClean(t)
}
