package crilog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// DefaultMaxLine is the longest line written as one record when the caller sets no limit;
// it is kubelet's and containerd's default (16 KiB).
const DefaultMaxLine = 16 * 1024

// Stream names as kubelet's log parser expects them.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Tags of a record: a full line, or a part of a line that goes on in the next record.
const (
	tagFull    = 'F'
	tagPartial = 'P'
)

// fileMode is what kubelet's own log files get; the directory is kubelet's to own.
const (
	fileMode = 0o640
	dirMode  = 0o755
)

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("crilog: writer closed")

// Writer appends CRI log records of any number of streams to one file. Records of
// different streams never interleave within a line: each record is written with one
// write(2) under a lock, and the file is opened O_APPEND.
//
// A batch of records that cannot be written (a full disk, any write error) is dropped
// and counted (Dropped), and what a short write left of it is cut off again, so the
// file holds only whole records; the next batch is tried afresh, so writing resumes by
// itself once there is space.
type Writer struct {
	path    string
	maxLine int
	now     func() time.Time

	mu sync.Mutex
	f  *os.File
	// brokenTail is set when a short write's remains could not be cut off: the next
	// record starts on a new line, so that at most that fragment is unreadable.
	brokenTail     bool
	droppedRecords uint64
	droppedBytes   uint64
}

// Open creates (or appends to) the log file at path, creating its directory if needed.
// maxLine <= 0 means DefaultMaxLine.
func Open(path string, maxLine int) (*Writer, error) {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	f, err := openFile(path)
	if err != nil {
		return nil, err
	}
	return &Writer{path: path, maxLine: maxLine, now: time.Now, f: f}, nil
}

func openFile(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return nil, fmt.Errorf("create log directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, fileMode)
	if err != nil {
		return nil, fmt.Errorf("open log file: %w", err)
	}
	return f, nil
}

// Path returns the log file's path.
func (w *Writer) Path() string { return w.path }

// Reopen opens path anew, so that after kubelet renamed the file (log rotation) new
// records go to a fresh file. The old file stays in use if the new one cannot be opened.
func (w *Writer) Reopen() error {
	f, err := openFile(w.path)
	if err != nil {
		return err
	}
	w.mu.Lock()
	old := w.f
	if old == nil {
		w.mu.Unlock()
		_ = f.Close()
		return ErrClosed
	}
	w.f = f
	w.brokenTail = false // a fragment left in the old file stays there
	w.mu.Unlock()
	if err := old.Close(); err != nil {
		return fmt.Errorf("close rotated log file: %w", err)
	}
	return nil
}

// Close closes the file; streams should be closed first so their last lines are written.
func (w *Writer) Close() error {
	w.mu.Lock()
	f := w.f
	w.f = nil
	w.mu.Unlock()
	if f == nil {
		return nil
	}
	return f.Close()
}

// Dropped returns how many records, and bytes of them, could not be written so far.
func (w *Writer) Dropped() (records, bytes uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.droppedRecords, w.droppedBytes
}

// write appends p, whole records only, with one write(2); if that fails, p is dropped
// and counted.
func (w *Writer) write(p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return ErrClosed
	}
	if w.brokenTail {
		if _, err := w.f.Write([]byte{'\n'}); err != nil {
			return w.drop(p, 0, err)
		}
		w.brokenTail = false
	}
	n, err := w.f.Write(p)
	if err != nil {
		return w.drop(p, n, err)
	}
	return nil
}

// drop counts the records of p as lost after a write of them failed with err having
// written n bytes, and removes those n bytes from the end of the file.
func (w *Writer) drop(p []byte, n int, err error) error {
	w.droppedRecords += uint64(bytes.Count(p, []byte{'\n'}))
	w.droppedBytes += uint64(len(p))
	if n > 0 {
		if terr := w.cutTail(int64(n)); terr != nil {
			w.brokenTail = true
		}
	}
	return fmt.Errorf("write log file: %w", err)
}

// cutTail truncates the last n bytes of the file: the part of a record a short write
// left. Only this Writer appends to the file, so its end is where that write ended.
func (w *Writer) cutTail(n int64) error {
	fi, err := w.f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < n {
		return fmt.Errorf("log file is %d bytes, shorter than the %d just written", fi.Size(), n)
	}
	return w.f.Truncate(fi.Size() - n)
}

// Stream returns a writer for one stream (Stdout or Stderr) of the log. A Stream must be
// used by one goroutine at a time; different streams may write concurrently.
func (w *Writer) Stream(name string) *Stream {
	return &Stream{w: w, name: name}
}

// Stream turns the bytes of one output stream into records.
type Stream struct {
	w    *Writer
	name string
	// pending holds the start of a line whose newline has not arrived yet; it never
	// holds more than maxLine bytes (beyond that a P record is written).
	pending []byte
}

// keepPending is the capacity a stream keeps for partial lines between writes; a larger
// buffer, needed only for a long partial line, is dropped once the line is written.
const keepPending = 512

// outPool holds the buffers records are assembled in, shared by all streams.
var outPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// maxPooled keeps buffers grown for a huge batch out of the pool.
const maxPooled = 64 << 10

// Write splits p into lines and writes a record for every complete line (or maxLine
// part of one); an incomplete last line waits for its newline, Flush or Close. Every
// byte is consumed even when the file cannot be written, so that a caller copying a
// pipe keeps draining it; the write error is returned.
func (s *Stream) Write(p []byte) (int, error) {
	n := len(p)
	bp := outPool.Get().(*[]byte)
	out := (*bp)[:0]
	now := s.w.now()
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			out = s.add(out, now, p, false)
			break
		}
		out = s.add(out, now, p[:i], true)
		p = p[i+1:]
	}
	var err error
	if len(out) > 0 {
		err = s.w.write(out)
	}
	if cap(out) <= maxPooled {
		*bp = out[:0]
		outPool.Put(bp)
	}
	return n, err
}

// add appends the records for seg, a piece of a line that a newline ends when complete.
func (s *Stream) add(out []byte, now time.Time, seg []byte, complete bool) []byte {
	if complete {
		// A terminal (or a Windows-minded program) ends lines with CRLF; kubelet
		// shows the text, so the CR goes, as containerd drops it.
		if l := len(seg); l > 0 {
			if seg[l-1] == '\r' {
				seg = seg[:l-1]
			}
		} else if l := len(s.pending); l > 0 && s.pending[l-1] == '\r' {
			s.pending = s.pending[:l-1]
		}
	}
	limit := s.w.maxLine
	for len(s.pending)+len(seg) > limit {
		room := limit - len(s.pending)
		out = s.record(out, now, tagPartial, s.pending, seg[:room])
		s.pending = s.pending[:0]
		seg = seg[room:]
	}
	if !complete {
		s.pending = append(s.pending, seg...)
		return out
	}
	out = s.record(out, now, tagFull, s.pending, seg)
	s.resetPending()
	return out
}

func (s *Stream) resetPending() {
	if cap(s.pending) > keepPending {
		s.pending = nil
		return
	}
	s.pending = s.pending[:0]
}

// record appends "<time> <stream> <tag> <a><b>\n".
func (s *Stream) record(out []byte, now time.Time, tag byte, a, b []byte) []byte {
	out = now.UTC().AppendFormat(out, time.RFC3339Nano)
	out = append(out, ' ')
	out = append(out, s.name...)
	out = append(out, ' ', tag, ' ')
	out = append(out, a...)
	out = append(out, b...)
	return append(out, '\n')
}

// Flush writes a pending incomplete line as a partial record. kubelet's reader ends a
// full record's text with a newline and a partial one's without (containerd's logger
// writes an unterminated last line as partial for the same reason), so the log holds
// exactly what the container wrote: `printf DONE` reads back as "DONE", not "DONE\n",
// which is what kubelet's termination message from logs must be. A line the writer
// stops in the middle of (criserver's copier shutting down, a restart) also stays
// whole: whatever continues it later is appended by the reader without a break.
func (s *Stream) Flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	bp := outPool.Get().(*[]byte)
	out := s.record((*bp)[:0], s.w.now(), tagPartial, s.pending, nil)
	s.resetPending()
	err := s.w.write(out)
	*bp = out[:0]
	outPool.Put(bp)
	return err
}

// Close flushes the stream; the Writer stays open for other streams.
func (s *Stream) Close() error {
	return s.Flush()
}
