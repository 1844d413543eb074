package crilog

import (
	"log/slog"
	"time"
)

// ReportInterval is how often a log that keeps failing is reported again: often
// enough to see that lines are still being lost, rarely enough that a full disk does
// not turn the writer's own log into a flood.
const ReportInterval = 30 * time.Second

// Sink feeds a CRI log stream and keeps draining when the file cannot be written: a
// full disk must not block the container on a full pipe. The records lost are counted
// by the crilog.Writer; the sink reports the first failure, then at most once per
// ReportInterval while failures go on, and when writing works again.
type Sink struct {
	s   *Stream
	w   *Writer
	log *slog.Logger
	now func() time.Time

	failing    bool
	lastReport time.Time
}

// NewSink returns a Sink writing stream of w, and the stream (to Close when the
// output ends).
func NewSink(w *Writer, stream string, log *slog.Logger) (*Sink, *Stream) {
	st := w.Stream(stream)
	return &Sink{s: st, w: w, log: log.With("stream", stream, "path", w.Path()), now: time.Now}, st
}

// Write never fails and always consumes p, so that the copy from the process's pipe
// never stops.
func (l *Sink) Write(p []byte) (int, error) {
	_, err := l.s.Write(p)
	switch {
	case err != nil && (!l.failing || l.now().Sub(l.lastReport) >= ReportInterval):
		records, bytes := l.w.Dropped()
		l.log.Warn("container log not written: lines dropped, the container keeps running",
			"error", err, "dropped_lines", records, "dropped_bytes", bytes)
		l.failing, l.lastReport = true, l.now()
	case err == nil && l.failing:
		records, bytes := l.w.Dropped()
		l.log.Info("container log written again", "dropped_lines", records, "dropped_bytes", bytes)
		l.failing = false
	}
	return len(p), nil
}
