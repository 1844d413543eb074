package imagetest

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
	rec  *tracetest.SpanRecorder
	root trace.Tracer
}

// NewTracer returns a Tracer, shut down at the end of the test.
func NewTracer(t testing.TB) *Tracer {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Tracer{rec: rec, root: tp.Tracer("test")}
}

// Root starts a root span of a new trace: pass its context to the code under test.
func (tr *Tracer) Root(name string) (context.Context, trace.Span) {
	return tr.root.Start(context.Background(), name)
}

// Spans returns the ended spans of root's trace, root excepted.
func (tr *Tracer) Spans(root trace.Span) []sdktrace.ReadOnlySpan {
	return inTrace(tr.rec.Ended(), root)
}

// Started counts the spans named name of root's trace that have started, ended or not.
func (tr *Tracer) Started(root trace.Span, name string) int {
	n := 0
	for _, s := range tr.rec.Started() {
		if s.SpanContext().TraceID() == root.SpanContext().TraceID() && s.Name() == name {
			n++
		}
	}
	return n
}

func inTrace(spans []sdktrace.ReadOnlySpan, root trace.Span) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() == root.SpanContext().TraceID() && s.SpanContext().SpanID() != root.SpanContext().SpanID() {
			out = append(out, s)
		}
	}
	return out
}

// Tree renders the ended spans under root, one a line, indented by depth: the name,
// key=value for each of keys the span has, and ERROR for an error status. Siblings
// are sorted by their rendered subtrees, so concurrent phases (the layers of a pull)
// render the same whatever order they ran in.
func (tr *Tracer) Tree(root trace.Span, keys ...attribute.Key) string {
	spans := tr.Spans(root)
	var render func(parent trace.SpanID, depth int) []string
	render = func(parent trace.SpanID, depth int) []string {
		var subtrees []string
		for _, s := range spans {
			if s.Parent().SpanID() != parent {
				continue
			}
			var b strings.Builder
			b.WriteString(strings.Repeat("  ", depth) + s.Name())
			for _, k := range keys {
				if v, ok := Attr(s, k); ok {
					fmt.Fprintf(&b, " %s=%s", k, v)
				}
			}
			if s.Status().Code == codes.Error {
				b.WriteString(" ERROR")
			}
			b.WriteString("\n")
			for _, c := range render(s.SpanContext().SpanID(), depth+1) {
				b.WriteString(c)
			}
			subtrees = append(subtrees, b.String())
		}
		slices.Sort(subtrees)
		return subtrees
	}
	return strings.Join(render(root.SpanContext().SpanID(), 0), "")
}

// Attr returns the value of attribute k of span s, as a string.
func Attr(s sdktrace.ReadOnlySpan, k attribute.Key) (string, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value.String(), true
		}
	}
	return "", false
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
