// Package tracing is the span API every layer of crisp uses, the shim included: it
// starts a child of the span in the context and ends it with the call's error.
//
// It holds no provider. A span is started with the provider of its parent
// (trace.SpanFromContext(ctx).TracerProvider()), so a phase is traced exactly when the
// call it runs under is: the CRI server span (criserver, OpenTelemetry SDK) or the
// shim's ttrpc server span (the shim's relay recorder). Work with no traced caller gets
// OpenTelemetry's no-op span, which costs a context lookup and nothing else. That is
// also why there is no global provider to set, and why this package must stay a leaf
// that the shim can link: the OpenTelemetry API only, no SDK, no net/http.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope of crisp's spans.
const Scope = "github.com/crisp-runtime/crisp"

// Start starts span name as a child of the span in ctx, with the parent's provider.
// Call End (or Finish) on the result.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		// No traced caller: skip the tracer lookup (the no-op provider's span).
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(Scope).Start(ctx, name, trace.WithAttributes(attrs...))
}

// Traced reports whether ctx carries a recording span: callers use it to skip building
// attributes that cost something to compute.
func Traced(ctx context.Context) bool {
	return trace.SpanFromContext(ctx).IsRecording()
}

// End ends span, marking it failed with err's message when err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Finish is End for a deferred call on a named error result: defer
// tracing.Finish(span, &err).
func Finish(span trace.Span, err *error) {
	End(span, *err)
}

// The relay: crisp's shim does not link an OTLP exporter (gRPC and net/http would
// cost every per-pod process memory), so it sends its finished spans, OTLP-encoded as
// a TracesData message, over ttrpc to criserver, which exports them with its own.
const (
	// RelayService and RelayMethod name criserver's ttrpc method that takes a shim's
	// spans (request opentelemetry.proto.trace.v1.TracesData, response Empty).
	RelayService = "crisp.tracing.v1.Relay"
	RelayMethod  = "Export"
	// RelayHeader is the ttrpc metadata key of a traced call to crisp's shim that
	// carries the relay's socket path: the shim records spans only for calls that
	// carry it, so a shim needs no tracing setting of its own and follows criserver's
	// across restarts.
	RelayHeader = "crisp-trace-relay"
	// TraceparentHeader is the W3C trace context header, as propagation.TraceContext
	// writes it into ttrpc metadata.
	TraceparentHeader = "traceparent"
)

// Attribute keys that several layers put on their spans, so that one query finds a
// pod's or a container's spans in criserver and in its shim: Kubernetes names from
// OpenTelemetry's semantic conventions, crisp's ids its own.
const (
	AttrSandboxID     = attribute.Key("crisp.sandbox.id")
	AttrContainerID   = attribute.Key("crisp.container.id")
	AttrPodName       = attribute.Key("k8s.pod.name")
	AttrPodNamespace  = attribute.Key("k8s.namespace.name")
	AttrPodUID        = attribute.Key("k8s.pod.uid")
	AttrContainerName = attribute.Key("k8s.container.name")
)
