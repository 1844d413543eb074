package task

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/crilog"
)

func testFIFO(t *testing.T) (path string, r *os.File) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return path, r
}

// readFIFOUntil reads r until it holds want or timeout passes, and returns what it read.
func readFIFOUntil(t *testing.T, r *os.File, want string, timeout time.Duration) string {
	t.Helper()
	var got []byte
	buf := make([]byte, 4096)
	deadline := time.Now().Add(timeout)
	rc, err := r.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for !bytes.Contains(got, []byte(want)) && time.Now().Before(deadline) {
		n := 0
		_ = rc.Control(func(fd uintptr) { n, _ = unix.Read(int(fd), buf) })
		if n <= 0 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		got = append(got, buf[:n]...)
	}
	return string(got)
}

// processEnd returns a copy of the process's end of a stream, which the test writes
// as the process would: stdio.started closes the shim's own copy.
func processEnd(t *testing.T, w any) *os.File {
	t.Helper()
	f, ok := w.(*os.File)
	if !ok || f == nil {
		t.Fatalf("the process's stream is %T %v, want a pipe", w, w)
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fd), "process-end")
}

// TestAttachWithoutLog: a container's init without a log file or FIFOs gets output
// pipes the shim drains (a process writing much more than a pipe holds never blocks
// while nobody is attached), and an attach session gets what it writes from then on.
func TestAttachWithoutLog(t *testing.T) {
	lp := &Stdio{}
	sio, err := openStdio(ioConfig{attachable: true}, lp, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer sio.close()
	out, errw := processEnd(t, lp.Stdout), processEnd(t, lp.Stderr)
	defer out.Close()
	defer errw.Close()
	if err := sio.started(); err != nil {
		t.Fatal(err)
	}

	// 4 MiB, 64 times a pipe's default buffer, with nobody attached.
	written := make(chan error, 1)
	go func() {
		_, err := out.Write(bytes.Repeat([]byte("x"), 4<<20))
		written <- err
	}()
	select {
	case err := <-written:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the process blocked writing its stdout while nobody was attached")
	}

	outPath, outR := testFIFO(t)
	errPath, errR := testFIFO(t)
	if err := sio.attach("", outPath, errPath); err != nil {
		t.Fatalf("attach: %v", err)
	}
	if _, err := out.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := errw.Write([]byte("oops\n")); err != nil {
		t.Fatal(err)
	}
	// The tail of the 4 MiB may still be on its way through the shim: what the
	// session gets must end with what was written after the attach.
	if got := readFIFOUntil(t, outR, "hi\n", 5*time.Second); strings.Trim(got, "x") != "hi\n" {
		t.Errorf("attached stdout got %q, want hi", got)
	}
	if got := readFIFOUntil(t, errR, "oops\n", 5*time.Second); got != "oops\n" {
		t.Errorf("attached stderr got %q", got)
	}

	// The process is gone: its streams end, and with them the session's.
	out.Close()
	errw.Close()
	if !sio.drain(5 * time.Second) {
		t.Fatal("the output copies did not end at the process's EOF")
	}
	if n := sio.fans[crilog.Stdout].Len() + sio.fans[crilog.Stderr].Len(); n != 0 {
		t.Errorf("%d attach sinks left after the streams ended", n)
	}
}

// TestExecOutputNotPiped: a process that is not attachable (an exec) and has no FIFO
// for a stream keeps /dev/null for it: no pipe whose drain its exit would wait for.
func TestExecOutputNotPiped(t *testing.T) {
	lp := &Stdio{}
	sio, err := openStdio(ioConfig{}, lp, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer sio.close()
	if lp.Stdout != nil || lp.Stderr != nil {
		t.Errorf("exec without FIFOs got stdout %v, stderr %v", lp.Stdout, lp.Stderr)
	}
	if err := sio.started(); err != nil {
		t.Fatal(err)
	}
	outPath, _ := testFIFO(t)
	if err := sio.attach("", outPath, ""); err != errAttachNoOutput {
		t.Errorf("attach to output the shim does not copy: %v, want errAttachNoOutput", err)
	}
}

// TestCloseStdinAfterAttachEOF: a stdin_once client closes its stdin FIFO and then calls
// CloseIO at once; the process still reads everything the client wrote, then EOF.
func TestCloseStdinAfterAttachEOF(t *testing.T) {
	lp := &Stdio{}
	cfg := ioConfig{stdin: "stdin", stdinMarker: true, attachable: true}
	sio, err := openStdio(cfg, lp, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer sio.close()
	in := processEnd(t, lp.Stdin)
	defer in.Close()
	if err := sio.started(); err != nil {
		t.Fatal(err)
	}
	read := make(chan int, 1)
	go func() {
		n, _ := io.Copy(io.Discard, in)
		read <- int(n)
	}()

	path := filepath.Join(t.TempDir(), "stdin")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	// As criserver does: its writer is open before the shim attaches.
	w, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := sio.attach(path, "", ""); err != nil {
		t.Fatalf("attach: %v", err)
	}
	// Four times what a FIFO holds: some is still in flight when CloseIO arrives.
	const size = 256 << 10
	if _, err := w.Write(bytes.Repeat([]byte("x"), size)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	sio.closeStdin()
	select {
	case n := <-read:
		if n != size {
			t.Errorf("the process read %d bytes before EOF, the client wrote %d", n, size)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the process's stdin did not end after CloseIO")
	}
}

// TestLabelledOutputPiped: a process with an SELinux label of its own gets pipes, not
// the caller's FIFOs (whose label its domain may not use); what it writes reaches the
// FIFOs, stdout and stderr sharing one FIFO included, and the FIFOs reach EOF after
// its exit. An unlabelled process gets the FIFO itself.
func TestLabelledOutputPiped(t *testing.T) {
	for _, tc := range []struct {
		name     string
		labelled bool
		shared   bool
	}{
		{"labelled", true, false},
		{"labelled, one FIFO for both streams", true, true},
		{"unlabelled", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outPath, outR := testFIFO(t)
			errPath, errR := outPath, outR
			if !tc.shared {
				errPath, errR = testFIFO(t)
			}
			lp := &Stdio{}
			sio, err := openStdio(ioConfig{stdout: outPath, stderr: errPath, labelled: tc.labelled}, lp, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer sio.close()
			for _, s := range []struct {
				f    *os.File
				path string
			}{{lp.Stdout, outPath}, {lp.Stderr, errPath}} {
				var st unix.Stat_t
				if err := unix.Fstat(int(s.f.Fd()), &st); err != nil {
					t.Fatal(err)
				}
				var fifo unix.Stat_t
				if err := unix.Stat(s.path, &fifo); err != nil {
					t.Fatal(err)
				}
				if isCaller := st.Ino == fifo.Ino && st.Dev == fifo.Dev; isCaller == tc.labelled {
					t.Errorf("labelled %v: the process's stream is the caller's FIFO: %v", tc.labelled, isCaller)
				}
			}
			out, errw := processEnd(t, lp.Stdout), processEnd(t, lp.Stderr)
			if err := sio.started(); err != nil {
				t.Fatal(err)
			}
			if _, err := out.Write([]byte("to stdout\n")); err != nil {
				t.Fatal(err)
			}
			if got := readFIFOUntil(t, outR, "to stdout\n", 5*time.Second); got != "to stdout\n" {
				t.Errorf("stdout FIFO got %q", got)
			}
			if _, err := errw.Write([]byte("to stderr\n")); err != nil {
				t.Fatal(err)
			}
			if got := readFIFOUntil(t, errR, "to stderr\n", 5*time.Second); got != "to stderr\n" {
				t.Errorf("stderr FIFO got %q", got)
			}
			out.Close()
			errw.Close()
			if !sio.drain(5 * time.Second) {
				t.Fatal("the copies did not end at the process's EOF")
			}
			sio.close()
			// Every writer is gone: the reader sees EOF (0 bytes, no EAGAIN).
			if n, err := unix.Read(int(outR.Fd()), make([]byte, 8)); n != 0 || err != nil {
				t.Errorf("stdout FIFO after the exit: read %d, %v; want EOF", n, err)
			}
		})
	}
}
