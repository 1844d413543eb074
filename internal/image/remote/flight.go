package remote

import (
	"context"
	"sync"

	digest "github.com/opencontainers/go-digest"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// flightGroup makes concurrent fetches of one blob share a single download, like
// x/sync/singleflight, with one difference that matters here: the download runs on
// its own context, cancelled only when every caller waiting for it has gone. With
// singleflight the first caller's context would govern the download, so one kubelet
// pull timing out would fail every other pull sharing the blob.
type flightGroup struct {
	mu      sync.Mutex
	flights map[digest.Digest]*flight
}

type flight struct {
	done    chan struct{}
	err     error
	waiters int
	cancel  context.CancelFunc
}

// do runs fn for key unless a run for key is already under way, and waits for the
// run's result or for ctx to end. shared reports whether the result came from a run
// started by another caller. When the last waiter leaves, the run is cancelled and do
// waits for fn to return, so that nothing of it (a goroutine, a partial file) outlives
// the calls that wanted it.
func (g *flightGroup) do(ctx context.Context, key digest.Digest, fn func(context.Context) error) (shared bool, err error) {
	g.mu.Lock()
	if g.flights == nil {
		g.flights = map[digest.Digest]*flight{}
	}
	f, shared := g.flights[key]
	if !shared {
		// WithoutCancel keeps the caller's values (loggers, trace ids) but not its deadline.
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight{done: make(chan struct{}), cancel: cancel}
		g.flights[key] = f
		go func() {
			f.err = fn(fctx)
			g.mu.Lock()
			if g.flights[key] == f {
				delete(g.flights, key)
			}
			g.mu.Unlock()
			cancel()
			close(f.done)
		}()
	}
	f.waiters++
	g.mu.Unlock()
	if shared {
		// The run's spans are in the trace of the caller that started it (its context
		// is fctx): this caller's trace gets a span of its own for the wait.
		_, span := tracing.Start(ctx, spanWait)
		if span.IsRecording() {
			span.SetAttributes(attrWaitFor.String(attrWaitDownload), attrBlobDigest.String(key.String()))
		}
		defer func() { tracing.End(span, err) }()
	}

	select {
	case <-f.done:
		return shared, f.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	f.waiters--
	last := f.waiters == 0
	if last && g.flights[key] == f {
		// A caller arriving from now on starts afresh instead of joining a run
		// that is being cancelled.
		delete(g.flights, key)
	}
	g.mu.Unlock()
	if last {
		f.cancel()
		<-f.done
	}
	return shared, ctx.Err()
}
