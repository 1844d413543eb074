package fifoio

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"
)

// readUntil reads r until it has want's length or timeout passes.
func readUntil(t *testing.T, r *os.File, want string, timeout time.Duration) string {
	t.Helper()
	buf := make([]byte, 256)
	var got []byte
	for deadline := time.Now().Add(timeout); len(got) < len(want) && time.Now().Before(deadline); {
		got = append(got, buf[:drainFIFO(r, buf)]...)
		time.Sleep(5 * time.Millisecond)
	}
	return string(got)
}

// TestAttachOutputAndStdin: a session's output FIFOs get what the streams carry from
// then on, its stdin reaches the process, and the session's stdin copy counts as ended
// once its client has closed the FIFO.
func TestAttachOutputAndStdin(t *testing.T) {
	var outLog, errLog bytes.Buffer
	stdout, stderr := NewFanout(&outLog), NewFanout(&errLog)
	a := NewAttach(stdout, stderr, false, nil)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()

	outPath, outR := fifo(t, "out")
	errPath, errR := fifo(t, "err")
	inPath, _ := fifo(t, "in")
	if err := a.Attach(inPath, outPath, errPath); !errors.Is(err, ErrNoStdin) {
		t.Fatalf("attach with stdin before SetStdin: %v, want ErrNoStdin", err)
	}
	a.SetStdin(pw)
	if err := a.Attach(inPath, outPath, errPath); err != nil {
		t.Fatal(err)
	}
	_, _ = stdout.Write([]byte("hello\n"))
	_, _ = stderr.Write([]byte("oops\n"))
	if got := readUntil(t, outR, "hello\n", 5*time.Second); got != "hello\n" {
		t.Errorf("session stdout got %q", got)
	}
	if got := readUntil(t, errR, "oops\n", 5*time.Second); got != "oops\n" {
		t.Errorf("session stderr got %q", got)
	}
	if outLog.String() != "hello\n" || errLog.String() != "oops\n" {
		t.Errorf("primary writers got %q and %q", outLog.String(), errLog.String())
	}

	in, err := os.OpenFile(inPath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.WriteString("typed\n"); err != nil {
		t.Fatal(err)
	}
	_ = in.Close()
	if !a.WaitStdin(5*time.Second, true) {
		t.Fatal("the ended session's stdin copy did not finish")
	}
	buf := make([]byte, 64)
	if n, err := pr.Read(buf); err != nil || string(buf[:n]) != "typed\n" {
		t.Errorf("process stdin got %q, %v", buf[:n], err)
	}
}

// TestAttachTerminalAndMissingStream: a terminal has one output stream, so a session's
// stderr FIFO stays unconnected; a requested stream without a fanout is refused before
// anything is opened.
func TestAttachTerminalAndMissingStream(t *testing.T) {
	var primary bytes.Buffer
	term := NewAttach(NewFanout(&primary), nil, true, nil)
	outPath, _ := fifo(t, "out")
	errPath, _ := fifo(t, "err")
	if err := term.Attach("", outPath, errPath); err != nil {
		t.Fatalf("terminal attach with a stderr FIFO: %v", err)
	}
	pipes := NewAttach(NewFanout(&primary), nil, false, nil)
	if err := pipes.Attach("", "", errPath); !errors.Is(err, ErrNoOutput) {
		t.Errorf("attach to a stream without a fanout: %v, want ErrNoOutput", err)
	}
}

// TestAttachAfterEnd: once a stream has ended, or the attach side is closed, sessions
// are refused, and a closed attach side ends the stdin copies still waiting.
func TestAttachAfterEnd(t *testing.T) {
	var primary bytes.Buffer
	stdout, stderr := NewFanout(&primary), NewFanout(&primary)
	a := NewAttach(stdout, stderr, false, nil)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	a.SetStdin(pw)

	firstOut, _ := fifo(t, "out")
	inPath, _ := fifo(t, "in")
	// The client keeps its writer open: the copy waits for input.
	w, err := os.OpenFile(inPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := a.Attach(inPath, firstOut, ""); err != nil {
		t.Fatal(err)
	}
	if a.WaitStdin(50*time.Millisecond, false) {
		t.Fatal("a copy whose client is still connected finished")
	}
	stderr.Close()
	outPath, _ := fifo(t, "out")
	errPath, _ := fifo(t, "err")
	if err := a.Attach("", outPath, errPath); !errors.Is(err, ErrAttachClosed) {
		t.Errorf("attach to an ended stream: %v, want ErrAttachClosed", err)
	}
	// Its stdout sink, added before the ended stderr refused the session, went again.
	if n := stdout.Len(); n != 1 {
		t.Errorf("stdout has %d sinks after the refused attach, want the first session's 1", n)
	}
	a.Close()
	if !a.WaitStdin(5*time.Second, false) {
		t.Error("Close did not end the stdin copy")
	}
	if err := a.Attach("", outPath, ""); !errors.Is(err, ErrAttachClosed) {
		t.Errorf("attach after Close: %v, want ErrAttachClosed", err)
	}
}
