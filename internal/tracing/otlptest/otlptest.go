// Package otlptest is an OTLP trace receiver for tests and benchmarks: the
// collector's gRPC TraceService and its HTTP /v1/traces endpoint on loopback, keeping
// every span it is sent.
package otlptest

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened with its resource's service name.
type Span struct {
	Service  string
	Name     string
	TraceID  string
	SpanID   string
	ParentID string
	Start    time.Time
	End      time.Time
	Attrs    map[string]string
	Error    string // the status message of a span with status Error
	Failed   bool
}

// Duration is End - Start.
func (s Span) Duration() time.Duration { return s.End.Sub(s.Start) }

// Receiver collects spans sent over OTLP/gRPC (GRPCAddr) and OTLP/HTTP (HTTPAddr).
type Receiver struct {
	collectorpb.UnimplementedTraceServiceServer
	GRPCAddr, HTTPAddr string

	grpcSrv *grpc.Server
	httpSrv *http.Server

	mu      sync.Mutex
	spans   []Span
	exports int
	changed chan struct{}
}

// Start listens on loopback ports for both protocols; Close stops both.
func Start() (*Receiver, error) {
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = gl.Close()
		return nil, err
	}
	r := &Receiver{GRPCAddr: gl.Addr().String(), HTTPAddr: hl.Addr().String(), changed: make(chan struct{})}
	r.grpcSrv = grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(r.grpcSrv, r)
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/traces", r.serveHTTP)
	r.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.grpcSrv.Serve(gl) }()
	go func() { _ = r.httpSrv.Serve(hl) }()
	return r, nil
}

// Close stops the receiver.
func (r *Receiver) Close() {
	r.grpcSrv.Stop()
	_ = r.httpSrv.Close()
}

// Export is the gRPC TraceService's method.
func (r *Receiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.add(req.GetResourceSpans())
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg collectorpb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(msg.GetResourceSpans())
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = io.Copy(w, bytes.NewReader(out))
}

func (r *Receiver) add(rs []*tracepb.ResourceSpans) {
	var got []Span
	for _, res := range rs {
		service := ""
		for _, kv := range res.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range res.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service: service, Name: s.GetName(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()),
					Start:    time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attrs:  map[string]string{},
					Failed: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
					Error:  s.GetStatus().GetMessage(),
				}
				if strings.Trim(sp.ParentID, "0") == "" {
					sp.ParentID = ""
				}
				for _, kv := range s.GetAttributes() {
					sp.Attrs[kv.GetKey()] = anyString(kv.GetValue())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.exports++
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	}
	return fmt.Sprint(v.GetValue())
}

// Spans returns every span received so far, sorted by start time.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	out := append([]Span(nil), r.spans...)
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Exports counts the export requests received.
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// Trace returns the spans of trace id (hex).
func (r *Receiver) Trace(id string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == id {
			out = append(out, s)
		}
	}
	return out
}

// WaitFor waits until ok holds for the spans received, or ctx ends.
func (r *Receiver) WaitFor(ctx context.Context, ok func([]Span) bool) ([]Span, error) {
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		spans := r.Spans()
		if ok(spans) {
			return spans, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return spans, ctx.Err()
		}
	}
}

// labelKeys are the attributes that tell apart spans of one name (the plugin, the
// helper's action, the hook): Tree shows the first a span has.
var labelKeys = []string{"crisp.cni.plugin.type", "crisp.helper.action", "crisp.nri.plugin.name", "crisp.cni.command"}

func label(s Span) string {
	for _, k := range labelKeys {
		if v := s.Attrs[k]; v != "" {
			return " (" + v + ")"
		}
	}
	return ""
}

// Tree renders spans as an indented tree (children under parents, by start time)
// with durations: what a person reads in a test log or a closing note.
func Tree(spans []Span) string {
	byID := map[string]bool{}
	children := map[string][]Span{}
	for _, s := range spans {
		byID[s.SpanID] = true
	}
	var roots []Span
	for _, s := range spans {
		if s.ParentID == "" || !byID[s.ParentID] {
			roots = append(roots, s)
			continue
		}
		children[s.ParentID] = append(children[s.ParentID], s)
	}
	var b strings.Builder
	var walk func(s Span, depth int)
	walk = func(s Span, depth int) {
		status := ""
		if s.Failed {
			status = " ERROR: " + s.Error
		}
		fmt.Fprintf(&b, "%s%s%s [%s] %.2f ms%s\n", strings.Repeat("  ", depth), s.Name, label(s), s.Service,
			float64(s.Duration().Microseconds())/1000, status)
		for _, c := range children[s.SpanID] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}
