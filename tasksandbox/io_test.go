package tasksandbox

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var criRecord = regexp.MustCompile(`^\S+ (stdout|stderr) (F|P) (.*)$`)

// readLog returns the "stream text" of each record of a CRI log.
func readLog(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if m := criRecord.FindStringSubmatch(l); m != nil {
			out = append(out, m[1]+" "+m[3])
		} else if l != "" {
			t.Fatalf("not a CRI log record: %q", l)
		}
	}
	return out
}

func testLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// shimEnd opens a FIFO the way a task-only shim does: for writing, with a reader of
// its own kept open so its writes never fail when criserver's reader goes.
func shimEnd(t *testing.T, path string) (w, r *os.File) {
	t.Helper()
	r, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err = os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); r.Close() })
	return w, r
}

func TestTaskIOLogAndAttach(t *testing.T) {
	bundle := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "c.log")
	r := IORecord{SandboxID: "pod", LogPath: logPath, Stdin: true}
	tio, err := newIO(bundle, r, true, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer tio.Close()
	if got, ok := readIORecord(bundle); !ok || got != r {
		t.Fatalf("io.json = %+v %v, want %+v", got, ok, r)
	}
	stdin, stdout, stderr := r.fifoPaths(bundle)
	outW, _ := shimEnd(t, stdout)
	errW, _ := shimEnd(t, stderr)

	// An attach session: its output FIFO gets a copy, its stdin reaches the container's.
	dir := t.TempDir()
	aOut, aIn := filepath.Join(dir, "out"), filepath.Join(dir, "in")
	for _, p := range []string{aOut, aIn} {
		if err := unix.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	aOutR, err := os.OpenFile(aOut, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer aOutR.Close()
	ctrIn, err := os.OpenFile(stdin, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ctrIn.Close()
	if err := tio.attach(aIn, aOut, ""); err != nil {
		t.Fatal(err)
	}
	aInW, err := os.OpenFile(aIn, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := aInW.WriteString("typed\n"); err != nil {
		t.Fatal(err)
	}
	aInW.Close()

	if _, err := outW.WriteString("one\ntw"); err != nil {
		t.Fatal(err)
	}
	if _, err := errW.WriteString("oops\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := outW.WriteString("o\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	var got []byte
	for deadline := time.Now().Add(5 * time.Second); len(got) < len("one\ntwo\n") && time.Now().Before(deadline); {
		if n, _ := aOutR.Read(buf); n > 0 {
			got = append(got, buf[:n]...)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if string(got) != "one\ntwo\n" {
		t.Errorf("attach session read %q", got)
	}
	// CloseStdin waits for the ended session's input to be read, then drops
	// criserver's writer: the container reads its input, then EOF.
	var in []byte
	go func() {
		time.Sleep(50 * time.Millisecond)
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			n, _ := ctrIn.Read(buf)
			in = append(in, buf[:max(n, 0)]...)
			if len(in) >= len("typed\n") {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	tio.CloseStdin()
	if string(in) != "typed\n" {
		t.Errorf("container stdin got %q before it was closed", in)
	}
	if err := tio.attach(aIn, "", ""); err == nil {
		t.Error("attach with stdin after CloseStdin succeeded")
	}

	outW.Close()
	errW.Close()
	if !tio.Wait(5 * time.Second) {
		t.Fatal("copy did not end when the shim closed its writers")
	}
	lines := readLog(t, logPath)
	want := map[string]bool{"stdout one": true, "stdout two": true, "stderr oops": true}
	if len(lines) != 3 {
		t.Fatalf("log %q", lines)
	}
	for _, l := range lines {
		if !want[l] {
			t.Errorf("log %q, unexpected %q", lines, l)
		}
	}
}

// After a restart, a container that exited while criserver was down gets what its
// FIFO still holds (the shim's own reader kept it).
func TestTaskIODrainAfterRestart(t *testing.T) {
	bundle := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "c.log")
	r := IORecord{SandboxID: "pod", LogPath: logPath, Terminal: true}
	first, err := newIO(bundle, r, true, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	_, stdout, stderr := r.fifoPaths(bundle)
	if stderr != "" {
		t.Errorf("a terminal has one output stream, got stderr FIFO %s", stderr)
	}
	w, _ := shimEnd(t, stdout)
	first.Close() // criserver killed
	if _, err := w.WriteString("last words\n"); err != nil {
		t.Fatal(err)
	}
	w.Close() // the container exited
	again, err := newIO(bundle, r, false, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	again.drain()
	if got := readLog(t, logPath); len(got) != 1 || got[0] != "stdout last words" {
		t.Errorf("log %q", got)
	}
}

func TestLineLogger(t *testing.T) {
	var lines []string
	h := &captureHandler{lines: &lines}
	l := &lineLogger{log: slog.New(h)}
	_, _ = l.Write([]byte("a\nb"))
	_, _ = l.Write([]byte("c\n\n"))
	_, _ = l.Write([]byte(strings.Repeat("x", maxShimLogLine+1)))
	l.flush()
	if len(lines) != 3 || lines[0] != "a" || lines[1] != "bc" || len(lines[2]) != maxShimLogLine+1 {
		t.Errorf("logged %d lines: %.40q", len(lines), lines)
	}
}

// captureHandler keeps the "line" attribute of each record.
type captureHandler struct{ lines *[]string }

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *captureHandler) WithGroup(string) slog.Handler            { return h }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "line" {
			*h.lines = append(*h.lines, a.Value.String())
		}
		return true
	})
	return nil
}
