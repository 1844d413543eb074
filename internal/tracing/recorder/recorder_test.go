package recorder

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
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

func decodeSpan(t *testing.T, b []byte) *tracepb.Span {
	t.Helper()
	var s tracepb.Span
	if err := proto.Unmarshal(b, &s); err != nil {
		t.Fatalf("the encoded span does not decode as OTLP: %v", err)
	}
	return &s
}

// TestEncodingMatchesOTLP: what the recorder encodes by hand is what the generated
// OTLP types decode, field for field, every attribute type included.
func TestEncodingMatchesOTLP(t *testing.T) {
	r := New("pod1", 77, slog.New(slog.NewTextHandler(io.Discard, nil)))
	parent := trace.SpanContextFromContext(sampledParent(t))
	ctx, s := r.Tracer("").Start(sampledParent(t), "encode me", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("s", "v"), attribute.String("empty", ""), attribute.Bool("b", true),
			attribute.Int64("i", -5), attribute.Float64("f", 1.5), attribute.StringSlice("ss", []string{"a", "b"}),
			attribute.Int64Slice("is", []int64{1, -2}), attribute.BoolSlice("bs", []bool{false}), attribute.Float64Slice("fs", []float64{0.25})))
	s.AddEvent("ev", trace.WithAttributes(attribute.Int("n", 3)))
	s.SetStatus(codes.Error, "bad")
	s.End()
	_ = ctx
	data := encodeTracesData(r.resource, "scope", r.buf)
	var td tracepb.TracesData
	if err := proto.Unmarshal(data, &td); err != nil {
		t.Fatal(err)
	}
	want := &tracepb.TracesData{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
			{Key: "process.pid", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: 77}}},
			{Key: "crisp.sandbox.id", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "pod1"}}},
		}},
		ScopeSpans: []*tracepb.ScopeSpans{{Scope: &commonpb.InstrumentationScope{Name: "scope"}}},
	}}}
	got := td.GetResourceSpans()[0].GetScopeSpans()[0].GetSpans()
	if len(got) != 1 {
		t.Fatalf("%d spans, want 1", len(got))
	}
	span := got[0]
	td.GetResourceSpans()[0].GetScopeSpans()[0].Spans = nil
	if !proto.Equal(&td, want) {
		t.Errorf("resource and scope = %v, want %v", &td, want)
	}
	sid, tid, pid := s.SpanContext().SpanID(), parent.TraceID(), parent.SpanID()
	str := func(v string) *commonpb.AnyValue {
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}
	}
	i64 := func(v int64) *commonpb.AnyValue {
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}
	}
	arr := func(vs ...*commonpb.AnyValue) *commonpb.AnyValue {
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: vs}}}
	}
	wantSpan := &tracepb.Span{
		TraceId: tid[:], SpanId: sid[:], ParentSpanId: pid[:], Name: "encode me", Kind: tracepb.Span_SPAN_KIND_SERVER,
		StartTimeUnixNano: span.StartTimeUnixNano, EndTimeUnixNano: span.EndTimeUnixNano, Flags: 1,
		Attributes: []*commonpb.KeyValue{
			{Key: "s", Value: str("v")}, {Key: "empty", Value: str("")},
			{Key: "b", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: true}}},
			{Key: "i", Value: i64(-5)},
			{Key: "f", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: 1.5}}},
			{Key: "ss", Value: arr(str("a"), str("b"))},
			{Key: "is", Value: arr(i64(1), i64(-2))},
			{Key: "bs", Value: arr(&commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: false}})},
			{Key: "fs", Value: arr(&commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: 0.25}})},
		},
		Events: []*tracepb.Span_Event{{TimeUnixNano: span.GetEvents()[0].GetTimeUnixNano(), Name: "ev",
			Attributes: []*commonpb.KeyValue{{Key: "n", Value: i64(3)}}}},
		Status: &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "bad"},
	}
	if !proto.Equal(span, wantSpan) {
		t.Errorf("span =\n%v\nwant\n%v", span, wantSpan)
	}
	if span.StartTimeUnixNano == 0 || span.EndTimeUnixNano < span.StartTimeUnixNano {
		t.Errorf("times %d..%d", span.StartTimeUnixNano, span.EndTimeUnixNano)
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
	in, out := decodeSpan(t, r.buf[0]), decodeSpan(t, r.buf[1])
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
