package tracingtest

import (
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

const keyN = attribute.Key("n")

// record builds, under a root of its own, a tree whose spans end in another order than
// they start, with explicit start times so that start order does not rest on the
// clock's resolution:
//
//	b (started first) with a client child c, then a n=1 with an error status.
func record(t *testing.T, tr *Tracer) trace.Span {
	t.Helper()
	ctx, root := tr.Root("root")
	tracer := tr.Provider().Tracer("test")
	t0 := time.Now()
	ctxB, b := tracer.Start(ctx, "b", trace.WithTimestamp(t0))
	_, c := tracer.Start(ctxB, "c", trace.WithTimestamp(t0.Add(time.Millisecond)), trace.WithSpanKind(trace.SpanKindClient))
	_, a := tracer.Start(ctx, "a", trace.WithTimestamp(t0.Add(2*time.Millisecond)), trace.WithAttributes(keyN.Int(1)))
	a.SetStatus(codes.Error, "failed")
	a.End()
	c.End()
	b.End()
	root.End()
	return root
}

// TestTree: siblings in start order, or sorted, a filter that drops a subtree, keys and
// ERROR, and Check's leading newlines.
func TestTree(t *testing.T) {
	tr := NewTracer(t)
	root := record(t, tr)
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"start order", []Option{Keys(keyN)}, "b\n  c\na n=1 ERROR\n"},
		{"sorted", []Option{Sorted()}, "a ERROR\nb\n  c\n"},
		{"only internal", []Option{Only(func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindInternal })}, "b\na ERROR\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tr.Tree(root, tc.opts...); got != tc.want {
				t.Errorf("tree:\n%s\nwant:\n%s", got, tc.want)
			}
			tr.Check(t, root, "\n\n"+tc.want, tc.opts...)
		})
	}
}

// TestTraces: what a Tracer reads back of a trace leaves out the spans of other traces.
func TestTraces(t *testing.T) {
	tr := NewTracer(t)
	root := record(t, tr)
	other := record(t, tr)
	if n := len(tr.Spans(root)); n != 3 {
		t.Errorf("%d spans under root, want 3", n)
	}
	if n := len(tr.Ended()); n != 8 {
		t.Errorf("%d spans ended, want 8", n)
	}
	if n := tr.Started(root, "a"); n != 1 {
		t.Errorf("%d spans a started in root's trace, want 1", n)
	}
	a := tr.Find(t, root, "a")
	if !a.SpanContext().IsValid() || a.SpanContext().TraceID() != root.SpanContext().TraceID() {
		t.Errorf("Find returned a span of trace %s", a.SpanContext().TraceID())
	}
	if got := Attr(a, keyN); got != "1" {
		t.Errorf("Attr n = %q, want 1", got)
	}
	if got := Attr(a, "missing"); got != "" {
		t.Errorf("Attr of a missing key = %q", got)
	}
	if self, ok := tr.Self(other); !ok || self.Name() != "root" || self.SpanContext().SpanID() != other.SpanContext().SpanID() {
		t.Errorf("Self = %v, %v", self, ok)
	}
	var ft fatalRecorder
	ft.TB = t
	if s := tr.Find(&ft, root, "missing"); s != nil || ft.fatal != "no span missing" {
		t.Errorf("Find of a missing span: %v, failure %q", s, ft.fatal)
	}
}

// fatalRecorder keeps the message of Fatalf, to check a failure without failing.
type fatalRecorder struct {
	testing.TB
	fatal string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }
