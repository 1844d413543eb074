package export

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/tracing"
	"github.com/crisp-runtime/crisp/internal/tracing/otlptest"
	"github.com/crisp-runtime/crisp/internal/tracing/recorder"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// shimServer serves a ttrpc method test.Shim/Do behind the shim's recorder, as
// shim.Serve does: the handler starts a child span and fails when asked to.
func shimServer(t *testing.T, rec *recorder.Recorder) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shim.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(rec.ServerInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	srv.RegisterService("test.Shim", &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		"Do": func(ctx context.Context, unmarshal func(any) error) (any, error) {
			var req emptypb.Empty
			if err := unmarshal(&req); err != nil {
				return nil, err
			}
			_, span := tracing.Start(ctx, "shim.work")
			tracing.End(span, nil)
			if fail, _ := ttrpc.GetMetadataValue(ctx, "fail"); fail != "" {
				return nil, errors.New("asked to fail")
			}
			return &emptypb.Empty{}, nil
		},
	}})
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return path
}

// TestRelayedTrace is the path of a traced CRI call into a shim: criserver's span,
// its ttrpc client span, the shim's server span and its child, one trace, each span
// the child of the one before, with the shim's spans relayed through criserver and
// exported over both OTLP protocols; an error in the shim marks its span.
func TestRelayedTrace(t *testing.T) {
	for _, protocol := range []string{config.TracingProtocolGRPC, config.TracingProtocolHTTP} {
		t.Run(protocol, func(t *testing.T) {
			recv, err := otlptest.Start()
			if err != nil {
				t.Fatal(err)
			}
			defer recv.Close()
			endpoint := recv.GRPCAddr
			if protocol == config.TracingProtocolHTTP {
				endpoint = recv.HTTPAddr
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cfg := config.Default().Tracing
			cfg.Enable, cfg.Endpoint, cfg.Protocol, cfg.Insecure = true, endpoint, protocol, true
			tr, err := New(ctx, cfg, filepath.Join(t.TempDir(), "relay.sock"), quietLog())
			if err != nil {
				t.Fatal(err)
			}
			rec := recorder.New("pod1", 4242, quietLog())
			shim := shimServer(t, rec)

			conn, err := net.Dial("unix", shim)
			if err != nil {
				t.Fatal(err)
			}
			client := ttrpc.NewClient(conn, ttrpc.WithUnaryClientInterceptor(tr.TTRPCClientInterceptor()))
			defer client.Close()

			rctx, root := tr.Provider().Tracer("test").Start(ctx, "cri.call")
			if err := client.Call(rctx, "test.Shim", "Do", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
				t.Fatal(err)
			}
			fctx := ttrpc.WithMetadata(rctx, ttrpc.MD{"fail": []string{"yes"}})
			if err := client.Call(fctx, "test.Shim", "Do", &emptypb.Empty{}, &emptypb.Empty{}); err == nil {
				t.Fatal("the failing call did not fail")
			}
			root.End()
			rec.Close(ctx)
			if err := tr.Close(ctx); err != nil {
				t.Fatal(err)
			}

			traceID := root.SpanContext().TraceID().String()
			spans := recv.Trace(traceID)
			t.Logf("trace:\n%s", otlptest.Tree(spans))
			byName := map[string][]otlptest.Span{}
			for _, s := range spans {
				byName[s.Name] = append(byName[s.Name], s)
			}
			if len(spans) != 7 || len(byName["test.Shim/Do"]) != 4 || len(byName["shim.work"]) != 2 {
				t.Fatalf("got %d spans %v; want cri.call, 2 client and 2 server test.Shim/Do, 2 shim.work", len(spans), byName)
			}
			rootID := root.SpanContext().SpanID().String()
			for _, s := range byName["shim.work"] {
				server := find(spans, s.ParentID)
				client := find(spans, server.ParentID)
				if server.Service != "crisp-shim" || server.Attrs["rpc.system"] != "ttrpc" || s.Service != "crisp-shim" {
					t.Errorf("shim spans %+v and %+v: want service crisp-shim, rpc.system ttrpc", server, s)
				}
				if client.Name != "test.Shim/Do" || client.Service != "crisp" || client.ParentID != rootID {
					t.Errorf("client span %+v: want test.Shim/Do of crisp under the root", client)
				}
			}
			failed := 0
			for _, s := range byName["test.Shim/Do"] {
				if s.Failed {
					failed++
				}
			}
			if failed != 2 {
				t.Errorf("%d test.Shim/Do spans failed, want the failing call's client and server span", failed)
			}
		})
	}
}

func find(spans []otlptest.Span, id string) otlptest.Span {
	for _, s := range spans {
		if s.SpanID == id {
			return s
		}
	}
	return otlptest.Span{}
}

// TestUntracedCalls: a call without a sampled span carries no trace context, and the
// shim records nothing; tracing off is a nil *Tracing whose methods add nothing.
func TestUntracedCalls(t *testing.T) {
	recv, err := otlptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := config.Default().Tracing
	cfg.Endpoint, cfg.Insecure = recv.GRPCAddr, true
	off, err := New(ctx, cfg, filepath.Join(t.TempDir(), "off.sock"), quietLog())
	if err != nil || off != nil {
		t.Fatalf("New with tracing off = %v, %v; want nil, nil", off, err)
	}
	if off.TTRPCClientInterceptor() != nil || off.GRPCServerOptions() != nil || off.Provider() != nil || off.Close(ctx) != nil {
		t.Error("a nil Tracing adds something")
	}

	cfg.Enable, cfg.SamplingRatio = true, 0
	tr, err := New(ctx, cfg, filepath.Join(t.TempDir(), "relay.sock"), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	rec := recorder.New("pod1", 1, quietLog())
	conn, err := net.Dial("unix", shimServer(t, rec))
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn, ttrpc.WithUnaryClientInterceptor(tr.TTRPCClientInterceptor()))
	defer client.Close()
	// Sampled out at the root (ratio 0), and not traced at all.
	sctx, span := tr.Provider().Tracer("test").Start(ctx, "sampled.out")
	for _, c := range []context.Context{sctx, ctx} {
		if err := client.Call(c, "test.Shim", "Do", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
			t.Fatal(err)
		}
	}
	span.End()
	if trace.SpanFromContext(sctx).SpanContext().IsSampled() {
		t.Fatal("ratio 0 sampled the root")
	}
	rec.Close(ctx)
	if err := tr.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(recv.Spans()); n != 0 {
		t.Errorf("received %d spans of untraced calls:\n%s", n, otlptest.Tree(recv.Spans()))
	}
}

func TestTaskShimEnv(t *testing.T) {
	for _, tc := range []struct {
		cfg  config.TracingConfig
		want []string
	}{
		{config.TracingConfig{Protocol: config.TracingProtocolGRPC, Endpoint: "otel:4317", Insecure: true, ServiceName: "crisp"}, []string{
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc", "OTEL_SERVICE_NAME=crisp-shim",
			"OTEL_EXPORTER_OTLP_TRACES_INSECURE=true", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://otel:4317"}},
		{config.TracingConfig{Protocol: config.TracingProtocolHTTP, Endpoint: "https://otel:443/otlp", ServiceName: "node"}, []string{
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=node-shim",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=https://otel:443/otlp"}},
		{config.TracingConfig{Protocol: config.TracingProtocolHTTP, ServiceName: "crisp"}, []string{
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=crisp-shim",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=https://127.0.0.1:4318/v1/traces"}},
	} {
		tr := &Tracing{cfg: tc.cfg}
		if got := tr.TaskShimEnv(); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("TaskShimEnv(%+v) = %q, want %q", tc.cfg, got, tc.want)
		}
	}
}
