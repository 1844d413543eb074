// Package recorder is the shim's tracing: an OpenTelemetry TracerProvider that
// records the spans of the ttrpc calls criserver traces and relays them, OTLP-encoded,
// to criserver, which exports them with its own exporter.
//
// Why a recorder of its own and not the OpenTelemetry SDK: the SDK and its exporters
// pull net/http, regexp and (for OTLP/gRPC) gRPC into the binary, which the shim's
// lean import graph keeps out because every per-pod shim pays for them in private
// memory (see cmd/shim-runc's TestLeanImportGraph). The API types (go.opentelemetry.io/
// otel/trace) and the OTLP messages are free of them, so the shim's code uses the
// standard API and criserver's exporter sends the shim's spans unchanged.
//
// A shim records only calls that carry a sampled W3C traceparent and the relay's
// address in their ttrpc metadata: it has no tracing setting of its own, and a shim
// driven by another caller (containerd) records nothing.
package recorder

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

const (
	// maxBuffered bounds the spans waiting for the relay: a shim whose criserver is
	// gone (restarting) must not grow; later spans are dropped.
	maxBuffered = 4096
	// batchDelay gathers the spans of one call burst (a pod start is a dozen calls)
	// into one relay call.
	batchDelay = 200 * time.Millisecond
	// relayTimeout bounds one relay call; criserver answers without waiting on the
	// collector.
	relayTimeout = 5 * time.Second
)

// Recorder is the shim's TracerProvider. Its sender goroutine starts with the first
// traced call (a shim that is never traced runs none) and stops with Close.
type Recorder struct {
	embedded.TracerProvider
	tracer   *tracer
	resource []attribute.KeyValue
	log      *slog.Logger

	mu      sync.Mutex
	started bool
	closed  bool
	relay   string
	buf     [][]byte // encoded Span messages
	dropped uint64

	wake chan struct{}
	stop chan struct{}
	done chan struct{}

	// client is the sender goroutine's own: only it dials and uses it.
	client     *ttrpc.Client
	clientPath string
}

// New returns the recorder of the shim of pod sandboxID.
func New(sandboxID string, pid int, log *slog.Logger) *Recorder {
	r := &Recorder{
		resource: []attribute.KeyValue{attribute.Int("process.pid", pid), tracing.AttrSandboxID.String(sandboxID)},
		log:      log,
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	r.tracer = &tracer{rec: r}
	return r
}

// Tracer returns the recorder's tracer (one for every scope: the shim has one).
func (r *Recorder) Tracer(string, ...trace.TracerOption) trace.Tracer { return r.tracer }

// Close relays what is left, within ctx, and stops the sender; spans ended later are
// dropped.
func (r *Recorder) Close(ctx context.Context) {
	r.mu.Lock()
	started := r.started
	r.closed = true
	r.mu.Unlock()
	if !started {
		return
	}
	close(r.stop)
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}

// ServerInterceptor makes a server span of each ttrpc call that carries a sampled
// trace context and the relay's address, as a child of the caller's client span.
func (r *Recorder) ServerInterceptor() ttrpc.UnaryServerInterceptor {
	return func(ctx context.Context, um ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, m ttrpc.Method) (any, error) {
		relay, ok := ttrpc.GetMetadataValue(ctx, tracing.RelayHeader)
		if !ok || !filepath.IsAbs(relay) {
			return m(ctx, um)
		}
		tp, _ := ttrpc.GetMetadataValue(ctx, tracing.TraceparentHeader)
		parent, ok := ParseTraceparent(tp)
		if !ok || !parent.IsSampled() {
			return m(ctx, um)
		}
		r.setRelay(relay)
		name := strings.TrimPrefix(info.FullMethod, "/")
		service, method, _ := strings.Cut(name, "/")
		ctx, span := r.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, parent), name,
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("rpc.system", "ttrpc"),
				attribute.String("rpc.service", service), attribute.String("rpc.method", method)))
		resp, err := m(ctx, um)
		tracing.End(span, err)
		return resp, err
	}
}

// setRelay records where spans go and starts the sender, once, unless the recorder
// is closed already.
func (r *Recorder) setRelay(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.relay = path
	if !r.started && !r.closed {
		r.started = true
		go r.send()
	}
}

// finish queues a finished span for the relay.
func (r *Recorder) finish(s []byte) {
	r.mu.Lock()
	if r.closed || len(r.buf) >= maxBuffered {
		r.dropped++
		r.mu.Unlock()
		return
	}
	r.buf = append(r.buf, s)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// send is the relay loop: it waits for a finished span, lets the burst finish, and
// relays the batch; on stop it relays what is left.
func (r *Recorder) send() {
	defer close(r.done)
	defer func() {
		if r.client != nil {
			_ = r.client.Close()
		}
	}()
	for {
		select {
		case <-r.stop:
			r.flush()
			return
		case <-r.wake:
		}
		select {
		case <-r.stop:
			r.flush()
			return
		case <-time.After(batchDelay):
		}
		r.flush()
	}
}

// flush relays the buffered spans in one call; a failed call drops them (the relay
// is criserver, which may be restarting: spans are not worth holding a pod's shim
// memory for).
func (r *Recorder) flush() {
	r.mu.Lock()
	spans, relay, dropped := r.buf, r.relay, r.dropped
	r.buf, r.dropped = nil, 0
	r.mu.Unlock()
	if dropped > 0 {
		r.log.Warn("tracing: dropped spans the relay could not take", "spans", dropped)
	}
	if len(spans) == 0 || relay == "" {
		return
	}
	data := encodeTracesData(r.resource, tracing.Scope, spans)
	ctx, cancel := context.WithTimeout(context.Background(), relayTimeout)
	defer cancel()
	if err := r.call(ctx, relay, data); err != nil {
		r.log.Debug("tracing: relay spans", "relay", relay, "spans", len(spans), "err", err)
	}
}

func (r *Recorder) call(ctx context.Context, relay string, data []byte) error {
	if r.client != nil && r.clientPath != relay {
		_ = r.client.Close()
		r.client = nil
	}
	if r.client == nil {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", relay)
		if err != nil {
			return fmt.Errorf("dial the trace relay: %w", err)
		}
		r.client, r.clientPath = ttrpc.NewClient(conn), relay
	}
	// ttrpc marshals proto messages only: the encoded TracesData rides as the unknown
	// fields of an Empty, which marshals them verbatim, so the relay reads a TracesData.
	req := &emptypb.Empty{}
	req.ProtoReflect().SetUnknown(protoreflect.RawFields(data))
	err := r.client.Call(ctx, tracing.RelayService, tracing.RelayMethod, req, &emptypb.Empty{})
	if err != nil {
		// Dial afresh next time: criserver may have restarted behind the same path.
		_ = r.client.Close()
		r.client = nil
		return fmt.Errorf("relay spans: %w", err)
	}
	return nil
}

// ParseTraceparent reads a W3C traceparent header (version 00, or a later version's
// first four fields, as the spec asks) into a remote span context.
func ParseTraceparent(h string) (trace.SpanContext, bool) {
	parts := strings.Split(strings.TrimSpace(h), "-")
	if len(parts) < 4 || len(parts[0]) != 2 || parts[0] == "ff" || (parts[0] == "00" && len(parts) != 4) {
		return trace.SpanContext{}, false
	}
	if _, err := hex.DecodeString(parts[0]); err != nil {
		return trace.SpanContext{}, false
	}
	tid, err := trace.TraceIDFromHex(parts[1])
	if err != nil {
		return trace.SpanContext{}, false
	}
	sid, err := trace.SpanIDFromHex(parts[2])
	if err != nil {
		return trace.SpanContext{}, false
	}
	flags, err := hex.DecodeString(parts[3])
	if err != nil || len(flags) != 1 {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]) & trace.FlagsSampled, Remote: true,
	})
	return sc, sc.IsValid()
}

type tracer struct {
	embedded.Tracer
	rec *Recorder
}

// Start records a child of the span in ctx when that one is sampled; without a
// sampled parent it records nothing (the shim starts no traces of its own).
func (t *tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	cfg := trace.NewSpanStartConfig(opts...)
	if cfg.NewRoot() || !parent.IsSampled() {
		return ctx, trace.SpanFromContext(ctx)
	}
	s := &span{
		rec:    t.rec,
		parent: parent.SpanID(),
		name:   name,
		kind:   cfg.SpanKind(),
		start:  cfg.Timestamp(),
		attrs:  cfg.Attributes(),
		sc: trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: parent.TraceID(), SpanID: newSpanID(), TraceFlags: parent.TraceFlags(), TraceState: parent.TraceState(),
		}),
	}
	if s.start.IsZero() {
		s.start = time.Now()
	}
	return trace.ContextWithSpan(ctx, s), s
}

func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		v := rand.Uint64()
		for i := range id {
			id[i] = byte(v >> (8 * i))
		}
	}
	return id
}

type event struct {
	name  string
	at    time.Time
	attrs []attribute.KeyValue
}

// span is one recorded span; its methods are safe for concurrent use, as the API
// requires.
type span struct {
	embedded.Span
	rec    *Recorder
	sc     trace.SpanContext
	parent trace.SpanID
	kind   trace.SpanKind
	start  time.Time

	mu     sync.Mutex
	name   string
	attrs  []attribute.KeyValue
	events []event
	status codes.Code
	desc   string
	ended  bool
}

func (s *span) SpanContext() trace.SpanContext { return s.sc }

func (s *span) IsRecording() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended
}

func (s *span) SetStatus(code codes.Code, desc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The API's precedence: Ok is final, Error beats Unset; only Error has a text.
	if s.ended || s.status == codes.Ok || code < s.status {
		return
	}
	s.status, s.desc = code, ""
	if code == codes.Error {
		s.desc = desc
	}
}

func (s *span) SetName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.name = name
	}
}

func (s *span) SetAttributes(kvs ...attribute.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.attrs = append(s.attrs, kvs...)
	}
}

func (s *span) AddEvent(name string, opts ...trace.EventOption) {
	cfg := trace.NewEventConfig(opts...)
	at := cfg.Timestamp()
	if at.IsZero() {
		at = time.Now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.events = append(s.events, event{name: name, at: at, attrs: cfg.Attributes()})
	}
}

// AddLink drops links: no crisp span makes them.
func (s *span) AddLink(trace.Link) {}

func (s *span) RecordError(err error, opts ...trace.EventOption) {
	if err == nil {
		return
	}
	opts = append(opts, trace.WithAttributes(
		attribute.String("exception.type", fmt.Sprintf("%T", err)),
		attribute.String("exception.message", err.Error())))
	s.AddEvent("exception", opts...)
}

func (s *span) TracerProvider() trace.TracerProvider { return s.rec }

func (s *span) End(opts ...trace.SpanEndOption) {
	endCfg := trace.NewSpanEndConfig(opts...)
	end := endCfg.Timestamp()
	if end.IsZero() {
		end = time.Now()
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	out := s.encode(uint64(end.UnixNano()))
	s.mu.Unlock()
	s.rec.finish(out)
}
