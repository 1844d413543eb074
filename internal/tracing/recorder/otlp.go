package recorder

import (
	"math"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"google.golang.org/protobuf/encoding/protowire"
)

// The OTLP messages the shim sends, encoded by hand with protowire: the generated
// types (go.opentelemetry.io/proto/otlp) would register their descriptors at every
// shim's start and build their marshalling tables at its first traced call, about
// 50 KiB and 90 KiB of private memory a shim (measured, docs/performance.md). Field
// numbers are opentelemetry/proto's (trace/v1/trace.proto, common/v1/common.proto,
// resource/v1/resource.proto); TestEncodingMatchesOTLP decodes the result with the
// generated types.
const (
	tracesDataResourceSpans = 1

	resourceSpansResource   = 1
	resourceSpansScopeSpans = 2
	resourceAttributes      = 1
	scopeSpansScope         = 1
	scopeSpansSpans         = 2
	scopeName               = 1

	spanTraceID      = 1
	spanSpanID       = 2
	spanTraceState   = 3
	spanParentSpanID = 4
	spanName         = 5
	spanKind         = 6
	spanStartTime    = 7
	spanEndTime      = 8
	spanAttributes   = 9
	spanEvents       = 11
	spanStatus       = 15
	spanFlags        = 16

	eventTime       = 1
	eventName       = 2
	eventAttributes = 3

	statusMessage = 2
	statusCode    = 3
	// Status codes of the OTLP Status message (not the API's codes, which differ).
	statusCodeOK    = 1
	statusCodeError = 2

	keyValueKey   = 1
	keyValueValue = 2

	anyString = 1
	anyBool   = 2
	anyInt    = 3
	anyDouble = 4
	anyArray  = 5

	arrayValues = 1
)

// appendMessage appends field num holding the message enc builds.
func appendMessage(b []byte, num protowire.Number, enc func([]byte) []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), enc(nil))
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// encodeSpan is one Span message; s.mu is held.
func (s *span) encode(end uint64) []byte {
	tid, sid, pid := s.sc.TraceID(), s.sc.SpanID(), s.parent
	b := protowire.AppendBytes(protowire.AppendTag(nil, spanTraceID, protowire.BytesType), tid[:])
	b = protowire.AppendBytes(protowire.AppendTag(b, spanSpanID, protowire.BytesType), sid[:])
	b = appendString(b, spanTraceState, s.sc.TraceState().String())
	if pid.IsValid() {
		b = protowire.AppendBytes(protowire.AppendTag(b, spanParentSpanID, protowire.BytesType), pid[:])
	}
	b = appendString(b, spanName, s.name)
	// The API's SpanKind numbers are OTLP's (Internal 1 … Consumer 5).
	b = appendVarint(b, spanKind, uint64(s.kind))
	b = appendFixed64(b, spanStartTime, uint64(s.start.UnixNano()))
	b = appendFixed64(b, spanEndTime, end)
	b = appendAttributes(b, spanAttributes, s.attrs)
	for _, e := range s.events {
		b = appendMessage(b, spanEvents, func(m []byte) []byte {
			m = appendFixed64(m, eventTime, uint64(e.at.UnixNano()))
			m = appendString(m, eventName, e.name)
			return appendAttributes(m, eventAttributes, e.attrs)
		})
	}
	switch s.status {
	case codes.Error:
		b = appendMessage(b, spanStatus, func(m []byte) []byte {
			m = appendString(m, statusMessage, s.desc)
			return appendVarint(m, statusCode, statusCodeError)
		})
	case codes.Ok:
		b = appendMessage(b, spanStatus, func(m []byte) []byte { return appendVarint(m, statusCode, statusCodeOK) })
	}
	return protowire.AppendFixed32(protowire.AppendTag(b, spanFlags, protowire.Fixed32Type), uint32(s.sc.TraceFlags()))
}

// appendAttributes appends each valid attribute as a KeyValue in field num.
func appendAttributes(b []byte, num protowire.Number, attrs []attribute.KeyValue) []byte {
	for _, a := range attrs {
		if !a.Valid() {
			continue
		}
		b = appendMessage(b, num, func(m []byte) []byte {
			m = appendString(m, keyValueKey, string(a.Key))
			return appendMessage(m, keyValueValue, func(v []byte) []byte { return appendValue(v, a.Value) })
		})
	}
	return b
}

// appendValue is the fields of an AnyValue holding v.
func appendValue(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.BOOL:
		return appendVarint(b, anyBool, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		return appendVarint(b, anyInt, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		return appendFixed64(b, anyDouble, math.Float64bits(v.AsFloat64()))
	case attribute.BOOLSLICE:
		return appendArray(b, len(v.AsBoolSlice()), func(i int) attribute.Value { return attribute.BoolValue(v.AsBoolSlice()[i]) })
	case attribute.INT64SLICE:
		return appendArray(b, len(v.AsInt64Slice()), func(i int) attribute.Value { return attribute.Int64Value(v.AsInt64Slice()[i]) })
	case attribute.FLOAT64SLICE:
		return appendArray(b, len(v.AsFloat64Slice()), func(i int) attribute.Value { return attribute.Float64Value(v.AsFloat64Slice()[i]) })
	case attribute.STRINGSLICE:
		return appendArray(b, len(v.AsStringSlice()), func(i int) attribute.Value { return attribute.StringValue(v.AsStringSlice()[i]) })
	}
	// A string, written even when empty: an AnyValue with no field is "no value".
	return protowire.AppendString(protowire.AppendTag(b, anyString, protowire.BytesType), v.AsString())
}

func appendArray(b []byte, n int, at func(int) attribute.Value) []byte {
	return appendMessage(b, anyArray, func(arr []byte) []byte {
		for i := range n {
			arr = appendMessage(arr, arrayValues, func(v []byte) []byte { return appendValue(v, at(i)) })
		}
		return arr
	})
}

// encodeTracesData is a TracesData message of one resource and one scope holding
// spans, each an encoded Span.
func encodeTracesData(resource []attribute.KeyValue, scope string, spans [][]byte) []byte {
	return appendMessage(nil, tracesDataResourceSpans, func(rs []byte) []byte {
		rs = appendMessage(rs, resourceSpansResource, func(r []byte) []byte { return appendAttributes(r, resourceAttributes, resource) })
		return appendMessage(rs, resourceSpansScopeSpans, func(ss []byte) []byte {
			ss = appendMessage(ss, scopeSpansScope, func(sc []byte) []byte { return appendString(sc, scopeName, scope) })
			for _, s := range spans {
				ss = protowire.AppendBytes(protowire.AppendTag(ss, scopeSpansSpans, protowire.BytesType), s)
			}
			return ss
		})
	})
}
