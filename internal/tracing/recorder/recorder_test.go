package recorder

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

func TestParseTraceparent(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, tc := range []struct {
		in          string
		ok, sampled bool
	}{
		{"00-" + tid + "-" + sid + "-01", true, true},
		{"00-" + tid + "-" + sid + "-00", true, false},
		{" 00-" + tid + "-" + sid + "-01 ", true, true},
		{"01-" + tid + "-" + sid + "-01-extra", true, true}, // a later version's first fields
		{"00-" + tid + "-" + sid + "-01-extra", false, false},
		{"ff-" + tid + "-" + sid + "-01", false, false},
		{"00-00000000000000000000000000000000-" + sid + "-01", false, false},
		{"00-" + tid + "-0000000000000000-01", false, false},
		{"00-" + tid[:30] + "-" + sid + "-01", false, false},
		{"00-" + tid + "-" + sid + "-1", false, false},
		{"zz-" + tid + "-" + sid + "-01", false, false},
		{"", false, false},
	} {
		sc, ok := ParseTraceparent(tc.in)
		if ok != tc.ok || sc.IsSampled() != tc.sampled {
			t.Errorf("ParseTraceparent(%q) = sampled %v, %v; want %v, %v", tc.in, sc.IsSampled(), ok, tc.sampled, tc.ok)
		}
		if ok && (sc.TraceID().String() != tid || sc.SpanID().String() != sid || !sc.IsRemote()) {
			t.Errorf("ParseTraceparent(%q) = %v", tc.in, sc)
		}
	}
}

func sampledParent(t *testing.T) context.Context {
	sc, ok := ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if !ok {
		t.Fatal("bad traceparent")
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), sc)
}

// TestSpanRecording checks what a span records: its parent, the API's status
// precedence, errors as exception events, nothing after End, and the buffer's bound.
func TestSpanRecording(t *testing.T) {
	r := New("pod", 1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, s := r.Tracer("").Start(sampledParent(t), "outer")
	_, child := r.Tracer("").Start(ctx, "inner")
	child.SetStatus(codes.Error, "first")
	child.SetStatus(codes.Unset, "")
	child.RecordError(errors.New("boom"))
	child.End()
	child.SetName("renamed after end")
	child.End()
	s.SetStatus(codes.Ok, "")
	s.SetStatus(codes.Error, "too late")
	s.End()
	if len(r.buf) != 2 {
		t.Fatalf("%d spans buffered, want 2", len(r.buf))
	}
	in, out := r.buf[0], r.buf[1]
	if in.Name != "inner" || string(in.ParentSpanId) != string(out.SpanId) || in.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR ||
		in.Status.GetMessage() != "first" || len(in.Events) != 1 || in.Events[0].Name != "exception" {
		t.Errorf("inner span = %v", in)
	}
	if out.Status.GetCode() != tracepb.Status_STATUS_CODE_OK || string(out.TraceId) != string(in.TraceId) {
		t.Errorf("outer span = %v", out)
	}

	// Not sampled, or no parent: nothing is recorded.
	for _, ctx := range []context.Context{context.Background(), trace.ContextWithRemoteSpanContext(context.Background(),
		trace.SpanContextFromContext(sampledParent(t)).WithTraceFlags(0))} {
		_, s := r.Tracer("").Start(ctx, "untraced")
		if s.IsRecording() {
			t.Error("an untraced start records")
		}
		s.End()
	}
	if len(r.buf) != 2 {
		t.Errorf("%d spans buffered after untraced starts, want 2", len(r.buf))
	}
	for range maxBuffered {
		_, s := r.Tracer("").Start(sampledParent(t), "many")
		s.End()
	}
	if len(r.buf) != maxBuffered || r.dropped != 2 {
		t.Errorf("buffered %d, dropped %d; want %d and 2", len(r.buf), r.dropped, maxBuffered)
	}
}
