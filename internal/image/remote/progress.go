package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
)

// StalledError is a request that received no byte for the progress timeout: the
// registry accepted it and then stopped sending. kubelet gives PullImage no deadline,
// so without it such a pull would keep its pod in ContainerCreating forever.
type StalledError struct {
	Host    string
	Timeout time.Duration
}

func (e *StalledError) Error() string {
	return fmt.Sprintf("%s sent no data for %v (image.pull_progress_timeout)", e.Host, e.Timeout)
}

// Unwrap makes the stall Unavailable: the registry, not the request, is at fault,
// and a later pull may succeed.
func (e *StalledError) Unwrap() error { return errdefs.ErrUnavailable }

// progressTransport cancels a request when no byte of its response arrives for
// timeout: neither the headers nor, once they came, the body. Each read that brings
// bytes restarts the wait, so a slow pull that keeps moving is never cut.
type progressTransport struct {
	next    http.RoundTripper
	timeout time.Duration
}

func (t *progressTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	w := &watchdog{timeout: t.timeout, cancel: cancel, stall: &StalledError{Host: req.URL.Host, Timeout: t.timeout}}
	w.arm()
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		w.stop()
		if w.fired() {
			err = w.stall
		}
		cancel(nil)
		return nil, err
	}
	resp.Body = &watchedBody{rc: resp.Body, w: w}
	return resp, nil
}

// watchdog cancels a request once no progress was seen for timeout. Reads record the
// time of their progress; the timer, when it fires, re-arms itself for what is left
// of the wait, so a read costs an atomic store rather than a timer reset.
type watchdog struct {
	timeout time.Duration
	cancel  context.CancelCauseFunc
	stall   *StalledError
	last    atomic.Int64 // unix nanoseconds of the last progress
	done    atomic.Bool  // fired or stopped
	hit     atomic.Bool  // fired

	mu    sync.Mutex
	timer *time.Timer
}

func (w *watchdog) arm() {
	w.last.Store(time.Now().UnixNano())
	w.mu.Lock()
	w.timer = time.AfterFunc(w.timeout, w.check)
	w.mu.Unlock()
}

func (w *watchdog) progress() { w.last.Store(time.Now().UnixNano()) }

func (w *watchdog) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done.Load() {
		return
	}
	if left := w.timeout - time.Since(time.Unix(0, w.last.Load())); left > 0 {
		w.timer.Reset(left)
		return
	}
	w.done.Store(true)
	w.hit.Store(true)
	w.cancel(w.stall)
}

func (w *watchdog) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done.Store(true)
	if w.timer != nil {
		w.timer.Stop()
	}
}

func (w *watchdog) fired() bool { return w.hit.Load() }

// watchedBody is a response body under a watchdog: its reads report progress, and a
// read cut by the watchdog fails with the stall rather than a bare cancellation.
type watchedBody struct {
	rc io.ReadCloser
	w  *watchdog
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.w.progress()
	}
	switch {
	case err == io.EOF:
		b.w.stop()
	case err != nil && b.w.fired():
		err = b.w.stall
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.w.stop()
	err := b.rc.Close()
	b.w.cancel(nil)
	return err
}

// IsStalled reports whether err is a progress timeout: a failure that would repeat
// for whoever waited on the same download, so it is theirs too rather than retried.
func IsStalled(err error) bool {
	var s *StalledError
	return errors.As(err, &s)
}
