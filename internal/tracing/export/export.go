// Package export is criserver's side of tracing: the OpenTelemetry SDK provider with
// an OTLP exporter (gRPC or HTTP), the CRI server's span per call (otelgrpc), the
// trace context carried over ttrpc to the shims (otelttrpc), and the relay that
// exports the spans crisp's shims send back.
//
// Only criserver links it: the shim records with internal/tracing/recorder, which
// has no exporter (see internal/tracing's relay constants for why).
package export

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/otelttrpc"
	"github.com/containerd/ttrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/tracing"
	"github.com/crisp-runtime/crisp/internal/version"
)

// relayQueue bounds the shim batches waiting for the collector: a collector that is
// down must not grow criserver's memory; what does not fit is dropped and counted.
const relayQueue = 256

// uploadTimeout bounds one upload of relayed spans.
const uploadTimeout = 10 * time.Second

// Tracing is criserver's tracing when it is on. The zero of *Tracing (nil) is "off":
// its methods then return what adds nothing.
type Tracing struct {
	tp         *sdktrace.TracerProvider
	prop       propagation.TextMapPropagator
	client     otlptrace.Client
	cfg        config.TracingConfig
	relayPath  string
	relaySrv   *ttrpc.Server
	queue      chan []*tracepb.ResourceSpans
	uploadDone chan struct{}
	dropped    atomic.Uint64
	log        *slog.Logger
	closeOnce  sync.Once
}

// New starts tracing as cfg says, or returns nil when cfg leaves it off. The relay
// for the shims' spans listens on relaySocket. Nothing is dialled here: the exporter
// connects on its first export, so a collector that is not up yet costs no start.
func New(ctx context.Context, cfg config.TracingConfig, relaySocket string, log *slog.Logger) (*Tracing, error) {
	if !cfg.Enable {
		return nil, nil
	}
	client, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("tracing: start the OTLP exporter: %w", err)
	}
	res := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(cfg.ServiceName),
		semconv.ServiceVersion(version.Version),
		semconv.ProcessPID(os.Getpid()),
	)
	if host, err := os.Hostname(); err == nil {
		res, _ = resource.Merge(res, resource.NewWithAttributes(semconv.SchemaURL, semconv.HostName(host)))
	}
	t := &Tracing{
		tp: sdktrace.NewTracerProvider(
			sdktrace.WithBatcher(exp),
			sdktrace.WithResource(res),
			// A call that carries kubelet's trace context follows its sampling
			// decision; the ratio is for the traces crisp starts itself.
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingRatio))),
		),
		prop:       propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		client:     client,
		cfg:        cfg,
		relayPath:  relaySocket,
		queue:      make(chan []*tracepb.ResourceSpans, relayQueue),
		uploadDone: make(chan struct{}),
		log:        log,
	}
	if err := t.serveRelay(ctx); err != nil {
		_ = t.tp.Shutdown(context.Background())
		return nil, err
	}
	// The uploads outlive ctx (criserver's, cancelled at shutdown) on purpose: Close
	// ends them once the last spans are flushed.
	go t.upload(context.WithoutCancel(ctx))
	target, _ := cfg.Target()
	log.Info("tracing on", "endpoint", target.HostPort, "protocol", cfg.Protocol, "insecure", target.Insecure,
		"sampling_ratio", cfg.SamplingRatio, "service_name", cfg.ServiceName)
	return t, nil
}

func newClient(cfg config.TracingConfig) (otlptrace.Client, error) {
	target, err := cfg.Target()
	if err != nil {
		return nil, err
	}
	if cfg.Protocol == config.TracingProtocolHTTP {
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(target.HostPort)}
		if target.Path != "" {
			opts = append(opts, otlptracehttp.WithURLPath(target.Path))
		}
		if target.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		return otlptracehttp.NewClient(opts...), nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(target.HostPort)}
	if target.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	return otlptracegrpc.NewClient(opts...), nil
}

// Provider is the tracer provider of criserver's spans (a no-op one when off).
func (t *Tracing) Provider() trace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.tp
}

// GRPCServerOptions give the CRI server a span per call that continues the trace
// context of the caller's metadata (kubelet's), or nothing when tracing is off.
func (t *Tracing) GRPCServerOptions() []grpc.ServerOption {
	if t == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tp),
		otelgrpc.WithPropagators(t.prop),
		otelgrpc.WithFilter(traceRPC),
	))}
}

// traceRPC leaves out GetContainerEvents: it is one call for the lifetime of kubelet,
// a span that would end (and be exported) only when kubelet goes away.
func traceRPC(info *stats.RPCTagInfo) bool {
	return !strings.HasSuffix(info.FullMethodName, "/GetContainerEvents")
}

// TTRPCClientInterceptor makes every call to a shim a client span and carries its
// context in the ttrpc metadata (W3C traceparent, as containerd's otelttrpc does), so
// that a shim that traces, containerd's included, joins the trace; a sampled call
// also carries the relay's address for crisp's shim. Nil when tracing is off.
func (t *Tracing) TTRPCClientInterceptor() ttrpc.UnaryClientInterceptor {
	if t == nil {
		return nil
	}
	inner := otelttrpc.UnaryClientInterceptor(otelttrpc.WithTracerProvider(t.tp), otelttrpc.WithPropagators(t.prop))
	relay := &ttrpc.KeyValue{Key: tracing.RelayHeader, Value: t.relayPath}
	return func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoker ttrpc.Invoker) error {
		if !trace.SpanContextFromContext(ctx).IsSampled() {
			return invoker(ctx, req, resp)
		}
		return inner(ctx, req, resp, info, func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response) error {
			req.Metadata = append(req.Metadata, relay)
			err := invoker(ctx, req, resp)
			// ttrpc hands the server's error back in resp.Status, turned into an error
			// only after the interceptors ran: otelttrpc sees a failed call as a
			// success, so the client span's status is set here.
			if st := resp.GetStatus(); err == nil && st.GetCode() != 0 {
				span := trace.SpanFromContext(ctx)
				span.SetStatus(codes.Error, st.GetMessage())
				span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.GetCode())))
			}
			return err
		})
	}
}

// shimName is the service.name of the shims' spans.
func (t *Tracing) shimName() string { return t.cfg.ServiceName + "-shim" }

// TaskShimEnv is the environment by which a task-only shim (containerd's, built with
// its shim_tracing tag) exports its own spans to the same collector: the OTLP
// exporter's standard variables, as containerd's shims inherit them from containerd.
// Their spans join crisp's trace through the traceparent every call carries.
func (t *Tracing) TaskShimEnv() []string {
	if t == nil {
		return nil
	}
	env := []string{
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=" + t.cfg.Protocol,
		"OTEL_SERVICE_NAME=" + t.shimName(),
	}
	target, _ := t.cfg.Target()
	scheme := "https://"
	if target.Insecure {
		scheme = "http://"
		env = append(env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE=true")
	}
	path := target.Path
	if t.cfg.Protocol == config.TracingProtocolHTTP && path == "" {
		path = "/v1/traces"
	}
	return append(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="+scheme+target.HostPort+path)
}

// RelayPath is the socket crisp's shims send their spans to.
func (t *Tracing) RelayPath() string {
	if t == nil {
		return ""
	}
	return t.relayPath
}

// Dropped counts the shim span batches dropped because the collector did not keep up.
func (t *Tracing) Dropped() uint64 {
	if t == nil {
		return 0
	}
	return t.dropped.Load()
}

// Close stops the relay and flushes every span recorded so far to the collector,
// within ctx.
func (t *Tracing) Close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var err error
	t.closeOnce.Do(func() {
		_ = t.relaySrv.Close()
		_ = os.Remove(t.relayPath)
		close(t.queue)
		select {
		case <-t.uploadDone:
		case <-ctx.Done():
		}
		// The provider's shutdown stops the exporter, and with it the shared client.
		err = t.tp.Shutdown(ctx)
	})
	return err
}

// serveRelay listens for crisp's shims' spans on relayPath (root only).
func (t *Tracing) serveRelay(ctx context.Context) error {
	if err := os.Remove(t.relayPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("tracing: remove the stale relay socket: %w", err)
	}
	l, err := net.Listen("unix", t.relayPath)
	if err != nil {
		return fmt.Errorf("tracing: listen for shim spans: %w", err)
	}
	if err := os.Chmod(t.relayPath, 0o600); err != nil {
		_ = l.Close()
		return fmt.Errorf("tracing: relay socket: %w", err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		_ = l.Close()
		return fmt.Errorf("tracing: relay server: %w", err)
	}
	srv.RegisterService(tracing.RelayService, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		tracing.RelayMethod: t.relayExport,
	}})
	t.relaySrv = srv
	go func() {
		if err := srv.Serve(ctx, l); err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
			t.log.Warn("tracing relay stopped", "err", err)
		}
	}()
	return nil
}

// relayExport takes one batch of a shim's spans. It never waits on the collector: the
// shim's call returns at once, and a full queue drops the batch.
func (t *Tracing) relayExport(_ context.Context, unmarshal func(any) error) (any, error) {
	var data tracepb.TracesData
	if err := unmarshal(&data); err != nil {
		return nil, err
	}
	rs := data.GetResourceSpans()
	for _, r := range rs {
		t.completeResource(r)
	}
	select {
	case t.queue <- rs:
	default:
		if t.dropped.Add(1) == 1 {
			t.log.Warn("tracing: the collector does not keep up; dropping shim spans")
		}
	}
	return &emptypb.Empty{}, nil
}

// completeResource names the shim's service as criserver's configuration says (the
// shim knows only its pod and pid).
func (t *Tracing) completeResource(r *tracepb.ResourceSpans) {
	if r.Resource == nil {
		return
	}
	for _, kv := range r.Resource.Attributes {
		if kv.GetKey() == string(semconv.ServiceNameKey) {
			return
		}
	}
	r.Resource.Attributes = append(r.Resource.Attributes, &commonpb.KeyValue{
		Key:   string(semconv.ServiceNameKey),
		Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: t.shimName()}},
	})
	r.SchemaUrl = semconv.SchemaURL
}

// upload sends the relayed batches until Close; it is the queue's only reader.
func (t *Tracing) upload(base context.Context) {
	defer close(t.uploadDone)
	for rs := range t.queue {
		ctx, cancel := context.WithTimeout(base, uploadTimeout)
		if err := t.client.UploadTraces(ctx, rs); err != nil {
			t.log.Debug("tracing: export shim spans", "err", err, "spans", countSpans(rs))
		}
		cancel()
	}
}

func countSpans(rs []*tracepb.ResourceSpans) int {
	n := 0
	for _, r := range rs {
		for _, s := range r.GetScopeSpans() {
			n += len(s.GetSpans())
		}
	}
	return n
}
