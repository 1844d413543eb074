package crilog

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crisp-runtime/crisp/internal/fifoio"
	"github.com/crisp-runtime/crisp/internal/testutil/fulldisk"
)

// recordingHandler keeps the messages and attributes logged through it.
type recordingHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	h.mu.Lock()
	h.msgs = append(h.msgs, b.String())
	h.mu.Unlock()
	return nil
}

func (h *recordingHandler) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}

// TestLogSinkFullDisk: with the log's filesystem full, a process's output pipe is
// still drained at once (the process never blocks on it), the lost lines are counted
// and reported once, then again only after ReportInterval, and once space is freed
// lines are written again and that is reported too.
func TestLogSinkFullDisk(t *testing.T) {
	dir := fulldisk.New(t, "size=1m")
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, bytes.Repeat([]byte{0}, 2<<20), 0o600); err == nil {
		t.Fatal("2 MiB filler fit into a 1 MiB tmpfs")
	}
	w, err := Open(filepath.Join(dir, "c.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	h := &recordingHandler{}
	sink, _ := NewSink(w, Stdout, slog.New(h))
	clock := time.Unix(1000, 0)
	sink.now = func() time.Time { return clock }

	// 8 MiB through a 64 KiB pipe: this only finishes if the sink keeps draining.
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	copied := make(chan error, 1)
	go func() { copied <- fifoio.CopyFile(sink, r) }()
	line := []byte(strings.Repeat("y", 1023) + "\n")
	start := time.Now()
	for i := 0; i < 8<<10; i++ {
		if _, err := pw.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	pw.Close()
	select {
	case err := <-copied:
		if err != nil {
			t.Fatalf("copy: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the copy from the pipe stopped")
	}
	r.Close()
	t.Logf("8 MiB of output drained in %v onto a full disk", time.Since(start))
	records, _ := w.Dropped()
	if records != 8<<10 {
		t.Errorf("dropped %d lines, want %d", records, 8<<10)
	}
	if msgs := h.messages(); len(msgs) != 1 || !strings.Contains(msgs[0], "dropped_lines=") {
		t.Fatalf("reports while failing: %q, want one", msgs)
	}

	if n, err := sink.Write(line); n != len(line) || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	clock = clock.Add(ReportInterval)
	if _, err := sink.Write(line); err != nil {
		t.Fatal(err)
	}
	if msgs := h.messages(); len(msgs) != 2 || !strings.Contains(msgs[1], "dropped_lines=8194") {
		t.Fatalf("reports after the interval: %q", msgs)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("back\n")); err != nil {
		t.Fatal(err)
	}
	msgs := h.messages()
	if len(msgs) != 3 || !strings.HasPrefix(msgs[2], "container log written again") {
		t.Fatalf("reports after space was freed: %q", msgs)
	}
	data, err := os.ReadFile(w.Path())
	if err != nil || !strings.HasSuffix(string(data), " stdout F back\n") {
		t.Fatalf("log after space was freed: %q, %v", data, err)
	}
}
