package crilog

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// record is one parsed log line.
type record struct {
	at     time.Time
	stream string
	tag    string
	text   string
}

// parse reads path the way kubelet's CRI log parser does: time, stream, tag, text.
func parse(t *testing.T, path string) []record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []record
	s := bufio.NewScanner(bytes.NewReader(data))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		line := s.Text()
		parts := strings.SplitN(line, " ", 4)
		if len(parts) != 4 {
			t.Fatalf("malformed line %q", line)
		}
		at, err := time.Parse(time.RFC3339Nano, parts[0])
		if err != nil {
			t.Fatalf("line %q: time: %v", line, err)
		}
		if !strings.HasSuffix(parts[0], "Z") {
			t.Fatalf("line %q: time is not UTC", line)
		}
		if parts[1] != Stdout && parts[1] != Stderr {
			t.Fatalf("line %q: stream %q", line, parts[1])
		}
		if parts[2] != "F" && parts[2] != "P" {
			t.Fatalf("line %q: tag %q", line, parts[2])
		}
		recs = append(recs, record{at: at, stream: parts[1], tag: parts[2], text: parts[3]})
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		t.Fatalf("file does not end with a newline: %q", data)
	}
	return recs
}

func open(t *testing.T, maxLine int) (*Writer, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pods", "ctr", "0.log")
	w, err := Open(path, maxLine)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, path
}

func summary(recs []record) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "%s %s %s|", r.stream, r.tag, r.text)
	}
	return b.String()
}

func TestFormat(t *testing.T) {
	w, path := open(t, 0)
	fixed := time.Date(2026, 7, 1, 12, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
	w.now = func() time.Time { return fixed }
	out, errs := w.Stream(Stdout), w.Stream(Stderr)
	mustWrite(t, out, "hello world\n")
	mustWrite(t, errs, "oops\n\n")
	mustWrite(t, out, "crlf\r\n")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "2026-07-01T10:00:00.123456789Z stdout F hello world\n" +
		"2026-07-01T10:00:00.123456789Z stderr F oops\n" +
		"2026-07-01T10:00:00.123456789Z stderr F \n" +
		"2026-07-01T10:00:00.123456789Z stdout F crlf\n"
	if string(data) != want {
		t.Fatalf("file =\n%s\nwant\n%s", data, want)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", fi.Mode().Perm())
	}
}

func mustWrite(t *testing.T, s *Stream, text string) {
	t.Helper()
	if n, err := s.Write([]byte(text)); err != nil || n != len(text) {
		t.Fatalf("write %q = %d, %v", text, n, err)
	}
}

func TestSplitting(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   string
	}{
		{"short", []string{"abc\n"}, "stdout F abc|"},
		{"exactly max", []string{"01234567\n"}, "stdout F 01234567|"},
		{"one over", []string{"012345678\n"}, "stdout P 01234567|stdout F 8|"},
		{"two and a half", []string{"0123456789abcdefXYZ\n"}, "stdout P 01234567|stdout P 89abcdef|stdout F XYZ|"},
		{"double max", []string{"0123456789abcdef\n"}, "stdout P 01234567|stdout F 89abcdef|"},
		{"chunked line", []string{"01", "234", "56789", "\n"}, "stdout P 01234567|stdout F 89|"},
		{"newline in next chunk", []string{"01234567", "\nx\n"}, "stdout F 01234567|stdout F x|"},
		{"cr split from lf", []string{"ab\r", "\n"}, "stdout F ab|"},
		{"partial at end", []string{"a\nbc"}, "stdout F a|stdout P bc|"},
		{"long partial at end", []string{"0123456789"}, "stdout P 01234567|stdout P 89|"},
		{"empty lines", []string{"\n\n"}, "stdout F |stdout F |"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, path := open(t, 8)
			s := w.Stream(Stdout)
			for _, c := range tt.chunks {
				mustWrite(t, s, c)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if got := summary(parse(t, path)); got != tt.want {
				t.Errorf("records %s, want %s", got, tt.want)
			}
		})
	}
}

// TestChunkingDoesNotMatter feeds the same text whole and one byte at a time.
func TestChunkingDoesNotMatter(t *testing.T) {
	text := strings.Repeat("x", 40) + "\nshort\n" + strings.Repeat("y", 17) + "\n\nend"
	var results []string
	for _, step := range []int{len(text), 1, 3, 7} {
		w, path := open(t, 16)
		s := w.Stream(Stderr)
		for i := 0; i < len(text); i += step {
			mustWrite(t, s, text[i:min(i+step, len(text))])
		}
		s.Close()
		results = append(results, summary(parse(t, path)))
	}
	for i, r := range results[1:] {
		if r != results[0] {
			t.Errorf("chunking %d gives %s, whole gives %s", i+1, r, results[0])
		}
	}
}

// TestConcurrentStreams writes long lines in random chunks from two goroutines and checks
// that every record is well formed and each stream's text comes back intact and in order.
func TestConcurrentStreams(t *testing.T) {
	w, path := open(t, 64)
	rng := rand.New(rand.NewSource(1))
	inputs := map[string]string{}
	for _, name := range []string{Stdout, Stderr} {
		var b strings.Builder
		for i := range 500 {
			fmt.Fprintf(&b, "%s-%d-%s\n", name, i, strings.Repeat(name[3:4], rng.Intn(200)))
		}
		inputs[name] = b.String()
	}
	var wg sync.WaitGroup
	for name, text := range inputs {
		wg.Add(1)
		go func(name, text string, seed int64) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed))
			s := w.Stream(name)
			for len(text) > 0 {
				n := min(1+r.Intn(100), len(text))
				if _, err := s.Write([]byte(text[:n])); err != nil {
					t.Error(err)
					return
				}
				text = text[n:]
			}
			s.Close()
		}(name, text, int64(len(name)+len(text)))
	}
	wg.Wait()
	got := map[string]*strings.Builder{Stdout: {}, Stderr: {}}
	for _, r := range parse(t, path) {
		if len(r.text) > 64 {
			t.Fatalf("record of %d bytes exceeds the limit", len(r.text))
		}
		got[r.stream].WriteString(r.text)
		if r.tag == "F" {
			got[r.stream].WriteByte('\n')
		}
	}
	for name, text := range inputs {
		if got[name].String() != text {
			t.Errorf("%s reassembled differs from what was written", name)
		}
	}
}

func TestReopen(t *testing.T) {
	w, path := open(t, 0)
	s := w.Stream(Stdout)
	mustWrite(t, s, "before\n")
	rotated := path + ".20260701-120000"
	if err := os.Rename(path, rotated); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, "still old\n")
	if err := w.Reopen(); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, "after\n")
	if got := summary(parse(t, rotated)); got != "stdout F before|stdout F still old|" {
		t.Errorf("rotated file: %s", got)
	}
	if got := summary(parse(t, path)); got != "stdout F after|" {
		t.Errorf("new file: %s", got)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Reopen(); err != ErrClosed {
		t.Errorf("Reopen after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Write([]byte("late\n")); err != ErrClosed {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
}

func TestAppendsToExistingFile(t *testing.T) {
	w, path := open(t, 0)
	mustWrite(t, w.Stream(Stdout), "one\n")
	w.Close()
	w2, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	mustWrite(t, w2.Stream(Stdout), "two\n")
	if got := summary(parse(t, path)); got != "stdout F one|stdout F two|" {
		t.Errorf("records %s", got)
	}
}

func BenchmarkWrite(b *testing.B) {
	w, err := Open(filepath.Join(b.TempDir(), "0.log"), 0)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	s := w.Stream(Stdout)
	chunk := []byte(strings.Repeat("some log line of moderate length\n", 100))
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		s.Write(chunk)
	}
}
