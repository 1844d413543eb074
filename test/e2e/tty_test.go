package e2e

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/remotecommand"
	clientexec "k8s.io/client-go/util/exec"
)

// ttySession is a streaming session with a terminal (exec or attach) run in the
// background, as kubectl exec -it or attach -it: what is written to in reaches the
// terminal, its output collects in out, and how the session ended arrives on errc.
type ttySession struct {
	in   *io.PipeWriter
	out  *lineWaiter
	errc chan error
}

// startTTY opens the terminal session at rawURL (a CRI Exec or Attach answer) over
// tr, with a terminal of width x height. The session lasts until it ends or ctx does;
// the terminal size queue is ended with the test.
func startTTY(ctx context.Context, t *testing.T, rawURL string, tr transport, width, height uint16) *ttySession {
	t.Helper()
	pr, pw := io.Pipe()
	size := &fixedSize{size: remotecommand.TerminalSize{Width: width, Height: height}, done: make(chan struct{})}
	t.Cleanup(func() { close(size.done) })
	s := &ttySession{in: pw, out: newLineWaiter(), errc: make(chan error, 1)}
	go func() {
		s.errc <- stream(ctx, t, rawURL, tr, remotecommand.StreamOptions{Stdin: pr, Stdout: s.out, Tty: true, TerminalSizeQueue: size})
		// Writes after the end fail instead of blocking.
		pr.CloseWithError(io.ErrClosedPipe)
	}()
	return s
}

// askUntil types line into the terminal every poll until want shows in the output:
// a line typed before the session is connected, or before the resize reached the
// terminal, gets no (or a stale) answer. want must be what the shell computes, not
// what the terminal echoes of line. what names the session in failures.
func (s *ttySession) askUntil(ctx context.Context, t *testing.T, what, line, want string, poll time.Duration) {
	t.Helper()
	for {
		if _, err := s.in.Write([]byte(line + "\n")); err != nil {
			t.Fatalf("%s: session ended: %v (output %q)", what, <-s.errc, s.out.String())
		}
		if s.out.wait(want, poll) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: no %q in the output: %q", what, want, s.out.String())
		}
	}
}

// end types line, which must end the session (an exit of the shell), and returns how
// the session ended; it fails the test if the session outlives ctx.
func (s *ttySession) end(ctx context.Context, t *testing.T, what, line string) error {
	t.Helper()
	_, _ = s.in.Write([]byte(line + "\n"))
	defer s.in.Close()
	select {
	case err := <-s.errc:
		return err
	case <-ctx.Done():
		t.Fatalf("%s did not end after %q: %q", what, line, s.out.String())
		return nil
	}
}

// checkExecTTY drives the exec session at rawURL, a shell with stdin and a terminal,
// as kubectl exec -it does: a resize to 99x33 reaches the shell's terminal (stty
// size), the terminal is a /dev/pts one, and the shell's exit code ends the session.
// Within ctx; the answer is asked again every poll.
func checkExecTTY(ctx context.Context, t *testing.T, rawURL string, tr transport, poll time.Duration) {
	t.Helper()
	const what = "exec with a terminal"
	s := startTTY(ctx, t, rawURL, tr, 99, 33)
	// The answer computes 42 (the echoed input does not hold it) and shows the
	// terminal's size once the resize reached it.
	s.askUntil(ctx, t, what, "echo tty-$((6*7)) $(stty size)", "tty-42 33 99", poll)
	err := s.end(ctx, t, what, "tty; exit 5")
	var ce clientexec.CodeExitError
	if !errors.As(err, &ce) || ce.Code != 5 {
		t.Errorf("%s ended with %T %v, want exit code 5", what, err, err)
	}
	if !strings.Contains(s.out.String(), "/dev/pts/") {
		t.Errorf("tty in the exec: %q, want /dev/pts/N", s.out.String())
	}
}
