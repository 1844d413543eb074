// Package tracingtest records the spans of an OpenTelemetry SDK provider for tests and
// renders those under a root span as an indented tree, to compare with the tree a
// test expects.
//
// It is an ordinary package so that the tests of several packages can import it;
// production code must not (depguard's test-helpers rule in .golangci.yml).
package tracingtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Tracer is an OpenTelemetry SDK provider whose spans a test reads back: what the
// code under test records under a root span the test starts.
type Tracer struct {
	tp   *sdktrace.TracerProvider
	rec  *tracetest.SpanRecorder
	root trace.Tracer
}

// NewTracer returns a Tracer, shut down at the end of the test.
func NewTracer(t testing.TB) *Tracer {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Tracer{tp: tp, rec: rec, root: tp.Tracer("test")}
}

// Provider returns the provider, for code that is handed one rather than reaching it
// through a span in its context (a ttrpc server interceptor, say).
func (tr *Tracer) Provider() *sdktrace.TracerProvider { return tr.tp }

// Root starts a root span of a new trace: pass its context to the code under test.
func (tr *Tracer) Root(name string) (context.Context, trace.Span) {
	return tr.root.Start(context.Background(), name)
}

// Ended returns every span that has ended, of any trace, in the order they ended: for
// the spans no root leads to, such as those of a call that carried no trace context.
func (tr *Tracer) Ended() []sdktrace.ReadOnlySpan { return tr.rec.Ended() }

// Spans returns the ended spans of root's trace, root excepted, in the order they
// ended.
func (tr *Tracer) Spans(root trace.Span) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.rec.Ended() {
		if inTrace(s, root) && s.SpanContext().SpanID() != root.SpanContext().SpanID() {
			out = append(out, s)
		}
	}
	return out
}

// Started counts the spans named name of root's trace that have started, ended or not:
// a test waits on it for the code under test to reach a point.
func (tr *Tracer) Started(root trace.Span, name string) int {
	n := 0
	for _, s := range tr.rec.Started() {
		if inTrace(s, root) && s.Name() == name {
			n++
		}
	}
	return n
}

// Self returns root as it ended, with its events: what the code under test added to
// the span it was given.
func (tr *Tracer) Self(root trace.Span) (sdktrace.ReadOnlySpan, bool) {
	for _, s := range tr.rec.Ended() {
		if s.SpanContext().Equal(root.SpanContext()) {
			return s, true
		}
	}
	return nil, false
}

// Find returns the first span named name to end in root's trace, and fails the test
// if there is none.
func (tr *Tracer) Find(t testing.TB, root trace.Span, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range tr.Spans(root) {
		if s.Name() == name {
			return s
		}
	}
	t.Fatalf("no span %s", name)
	return nil
}

// Attr returns the value of attribute k of span s as a string, "" if s has none.
func Attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	v, _ := attr(s, k)
	return v
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) (string, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value.String(), true
		}
	}
	return "", false
}

func inTrace(s sdktrace.ReadOnlySpan, root trace.Span) bool {
	return s.SpanContext().TraceID() == root.SpanContext().TraceID()
}

// Option changes how Tree and Check render the spans.
type Option func(*render)

type render struct {
	keys   []attribute.Key
	sorted bool
	keep   func(sdktrace.ReadOnlySpan) bool
}

// Keys prints key=value after a span's name for each of keys the span has, in the
// order given.
func Keys(keys ...attribute.Key) Option {
	return func(r *render) { r.keys = append(r.keys, keys...) }
}

// Sorted orders siblings by their rendered subtrees instead of by their start: phases
// that run concurrently (the layers of an image pull) start in any order, and the
// tree must not depend on it.
func Sorted() Option {
	return func(r *render) { r.sorted = true }
}

// Only renders the spans keep accepts; a span it refuses is left out with its whole
// subtree, so a test can check the spans of one layer and check apart those of, say,
// an RPC library under them.
func Only(keep func(sdktrace.ReadOnlySpan) bool) Option {
	return func(r *render) { r.keep = keep }
}

// Tree renders the ended spans under root, one a line indented two spaces a level:
// the name, " key=value" for each of the Keys the span has, and " ERROR" for an error
// status. Siblings come in the order they started unless Sorted.
func (tr *Tracer) Tree(root trace.Span, opts ...Option) string {
	var r render
	for _, o := range opts {
		o(&r)
	}
	spans := tr.Spans(root)
	var subtrees func(parent trace.SpanID, depth int) []string
	subtrees = func(parent trace.SpanID, depth int) []string {
		var kids []sdktrace.ReadOnlySpan
		for _, s := range spans {
			if s.Parent().SpanID() == parent && (r.keep == nil || r.keep(s)) {
				kids = append(kids, s)
			}
		}
		slices.SortStableFunc(kids, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
		out := make([]string, 0, len(kids))
		for _, s := range kids {
			var b strings.Builder
			b.WriteString(strings.Repeat("  ", depth) + s.Name())
			for _, k := range r.keys {
				if v, ok := attr(s, k); ok {
					fmt.Fprintf(&b, " %s=%s", k, v)
				}
			}
			if s.Status().Code == codes.Error {
				b.WriteString(" ERROR")
			}
			b.WriteString("\n")
			for _, c := range subtrees(s.SpanContext().SpanID(), depth+1) {
				b.WriteString(c)
			}
			out = append(out, b.String())
		}
		if r.sorted {
			slices.Sort(out)
		}
		return out
	}
	return strings.Join(subtrees(root.SpanContext().SpanID(), 0), "")
}

// Check fails the test unless Tree renders want; leading newlines of want are dropped,
// so that a raw string literal can start on the line after its backquote.
func (tr *Tracer) Check(t testing.TB, root trace.Span, want string, opts ...Option) {
	t.Helper()
	want = strings.TrimLeft(want, "\n")
	if got := tr.Tree(root, opts...); got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
}
