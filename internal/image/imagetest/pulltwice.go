package imagetest

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/crisp-runtime/crisp/internal/tracing/tracingtest"
)

// PullTwice runs pull twice at once, under root spans "first" and "second" of tr: the
// second starts once the first has stalled in n downloads (the registry is serving
// blobs through stall), and stall is released once the second has started n spans
// named wait, so the second pull is certain to find the first one's work under way.
// It fails the test unless both pulls succeed, and returns both roots, ended.
func PullTwice(t testing.TB, tr *tracingtest.Tracer, stall *Staller, n int, wait string, pull func(context.Context) error) (first, second trace.Span) {
	t.Helper()
	ctxA, first := tr.Root("first")
	errA := make(chan error, 1)
	go func() { errA <- pull(ctxA) }()
	for range n {
		select {
		case <-stall.Stalled():
		case <-time.After(10 * time.Second):
			t.Fatalf("the first pull did not start its %d downloads", n)
		}
	}
	ctxB, second := tr.Root("second")
	errB := make(chan error, 1)
	go func() { errB <- pull(ctxB) }()
	deadline := time.Now().Add(10 * time.Second)
	for tr.Started(second, wait) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the second pull started %d waits", tr.Started(second, wait))
		}
		time.Sleep(5 * time.Millisecond)
	}
	stall.Release()
	if err := <-errA; err != nil {
		t.Fatal(err)
	}
	if err := <-errB; err != nil {
		t.Fatal(err)
	}
	first.End()
	second.End()
	return first, second
}
