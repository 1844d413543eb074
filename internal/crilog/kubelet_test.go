package crilog

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/cri-client/pkg/logs"

	"github.com/crisp-runtime/crisp/internal/testutil/fulldisk"
)

// kubeletReads is what kubelet's CRI log reader (the one behind kubectl logs, crictl
// logs and the termination message from logs) gives back for the log files in order
// (a rotation leaves the older one first).
func kubeletReads(t *testing.T, paths ...string) (stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	for _, p := range paths {
		if err := logs.ReadLogs(context.Background(), p, "", &logs.LogOptions{}, nil, &o, &e); err != nil {
			t.Fatalf("kubelet's ReadLogs %s: %v", p, err)
		}
	}
	return o.String(), e.String()
}

// TestKubeletReadsWhatWasWritten: whatever the container writes, and however the
// writing is cut (chunks, the end of the stream, a rotation, a writer stopped in the
// middle of a line and a new one going on, lines longer than the maximum), kubelet's
// reader gives back exactly those bytes. The one change is containerd's: a CR right
// before a newline goes (terminal output reads as plain lines).
func TestKubeletReadsWhatWasWritten(t *testing.T) {
	long := strings.Repeat("0123456789", 5) // 50 bytes; the tests' maximum is 16
	for _, tc := range []struct {
		name   string
		chunks []string // written to stdout in this order; "|REOPEN|" rotates, "|RESTART|" closes the writer and opens a new one
		want   string   // what kubelet reads, all files together
	}{
		{"no newline at the end", []string{"DONE"}, "DONE"},
		{"lines then an unterminated one", []string{"a\nb\nDONE"}, "a\nb\nDONE"},
		{"newline at the end", []string{"DONE\n"}, "DONE\n"},
		{"empty lines", []string{"\n\n"}, "\n\n"},
		{"chunks without newlines", []string{"D", "O", "N", "E"}, "DONE"},
		{"long line with newline", []string{long + "\n"}, long + "\n"},
		{"long line without newline", []string{long}, long},
		{"exactly the maximum without newline", []string{long[:16]}, long[:16]},
		{"crlf", []string{"a\r\nb\r\n"}, "a\nb\n"},
		{"cr split from its lf", []string{"a\r", "\nb"}, "a\nb"},
		{"cr at the end", []string{"a\r"}, "a\r"},
		{"cr inside a line", []string{"50%\r100%\n"}, "50%\r100%\n"},
		{"rotation in the middle of a line", []string{"hel", "|REOPEN|", "lo\nworld"}, "hello\nworld"},
		{"rotation at the end of a line", []string{"one\n", "|REOPEN|", "two"}, "one\ntwo"},
		{"writer restarted in the middle of a line", []string{"hel", "|RESTART|", "lo\n"}, "hello\n"},
		{"writer restarted in the middle of a long line", []string{long[:20], "|RESTART|", long[20:] + "\n"}, long + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "c.log")
			w, err := Open(path, 16)
			if err != nil {
				t.Fatal(err)
			}
			files := []string{path}
			st := w.Stream(Stdout)
			for _, c := range tc.chunks {
				switch c {
				case "|REOPEN|":
					rotated := filepath.Join(dir, "c.log."+string(rune('0'+len(files))))
					if err := os.Rename(path, rotated); err != nil {
						t.Fatal(err)
					}
					files = append(files[:len(files)-1], rotated, path)
					if err := w.Reopen(); err != nil {
						t.Fatal(err)
					}
				case "|RESTART|":
					if err := st.Close(); err != nil {
						t.Fatal(err)
					}
					if err := w.Close(); err != nil {
						t.Fatal(err)
					}
					if w, err = Open(path, 16); err != nil {
						t.Fatal(err)
					}
					st = w.Stream(Stdout)
				default:
					if _, err := st.Write([]byte(c)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			out, errOut := kubeletReads(t, files...)
			if out != tc.want || errOut != "" {
				t.Errorf("kubelet reads stdout %q stderr %q, want %q", out, errOut, tc.want)
			}
		})
	}
}

// TestKubeletReadsStreamsApart: stdout and stderr interleaved, each ending without a
// newline, read back per stream.
func TestKubeletReadsStreamsApart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.log")
	w, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	o, e := w.Stream(Stdout), w.Stream(Stderr)
	for _, step := range []struct {
		s    *Stream
		data string
	}{{o, "out "}, {e, "err\nmore "}, {o, "line\nlast"}, {e, "tail"}} {
		if _, err := step.s.Write([]byte(step.data)); err != nil {
			t.Fatal(err)
		}
	}
	_ = o.Close()
	_ = e.Close()
	_ = w.Close()
	out, errOut := kubeletReads(t, path)
	if out != "out line\nlast" || errOut != "err\nmore tail" {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}
}

// TestKubeletReadsAfterFullDisk: records lost to a full disk are lost whole, and the
// line being written when space comes back ends as written: the unterminated piece
// the stream held through the full disk is a partial record, read back without a
// newline.
func TestKubeletReadsAfterFullDisk(t *testing.T) {
	dir := fulldisk.New(t, "size=64k")
	path := filepath.Join(dir, "c.log")
	w, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := w.Stream(Stdout)
	// Fill the disk with another file, then write a full line (lost) and the start of
	// the next (held).
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, bytes.Repeat([]byte{'x'}, 128<<10), 0o644); err == nil {
		t.Fatal("128 KiB of filler fit a 64 KiB tmpfs")
	}
	if _, err := st.Write([]byte("lost\nDO")); err == nil {
		t.Fatal("a write on a full disk succeeded")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("NE")); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	if out, _ := kubeletReads(t, path); out != "DONE" {
		t.Errorf("kubelet reads %q, want %q", out, "DONE")
	}
	if r, _ := w.Dropped(); r != 1 {
		t.Errorf("%d records dropped, want the one full line", r)
	}
}
