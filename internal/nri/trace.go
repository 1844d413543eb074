package nri

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/otelttrpc"
	"github.com/containerd/ttrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// How NRI is traced. Each hook is span nri.<hook> of the CRI call's trace. The library
// calls the plugins inside one call of its own and tells its Metrics, after each
// plugin's answer, the plugin's name, the event, how long it took, its error and its
// adjustment: with no context. The library runs one hook at a time (its lock is held
// for the whole hook), so crisp's NRI holds hookMu around each call into the library
// and routes those reports to the hook under way (cur), which turns each into a
// nri.plugin child timed as the library timed it. Validators run at once, each in a
// goroutine of the library; their reports come under the same create.
//
// The library's ttrpc calls to external plugins also carry the trace context
// (otelttrpc, as containerd 2.4 configures NRI), so a plugin that traces joins the
// trace: its spans are under the ttrpc client span, itself under the hook's span.
const (
	spanPlugin   = "nri.plugin"
	opValidation = "ValidateContainerAdjustment"
)

// Attribute keys: Kubernetes names from OpenTelemetry's semantic conventions, the
// rest crisp's own.
const (
	attrSandboxID     = tracing.AttrSandboxID
	attrPodName       = tracing.AttrPodName
	attrPodNamespace  = tracing.AttrPodNamespace
	attrContainerID   = tracing.AttrContainerID
	attrContainerName = tracing.AttrContainerName
	attrPlugins       = attribute.Key("crisp.nri.plugins")
	attrValidators    = attribute.Key("crisp.nri.validators")
	attrRejected      = attribute.Key("crisp.nri.rejected")
	attrAdjustments   = attribute.Key("crisp.nri.adjustments")
	attrUpdates       = attribute.Key("crisp.nri.updates")
	attrEvictions     = attribute.Key("crisp.nri.evictions")
	attrPluginName    = attribute.Key("crisp.nri.plugin.name")
	attrPluginIndex   = attribute.Key("crisp.nri.plugin.index")
	attrHook          = attribute.Key("crisp.nri.hook")
)

// hookSpanNames are the span names of the hooks, nri.<hook in snake case>.
var hookSpanNames = map[api.Event]string{
	api.Event_RUN_POD_SANDBOX:         "nri.run_pod_sandbox",
	api.Event_UPDATE_POD_SANDBOX:      "nri.update_pod_sandbox",
	api.Event_POST_UPDATE_POD_SANDBOX: "nri.post_update_pod_sandbox",
	api.Event_STOP_POD_SANDBOX:        "nri.stop_pod_sandbox",
	api.Event_REMOVE_POD_SANDBOX:      "nri.remove_pod_sandbox",
	api.Event_CREATE_CONTAINER:        "nri.create_container",
	api.Event_POST_CREATE_CONTAINER:   "nri.post_create_container",
	api.Event_START_CONTAINER:         "nri.start_container",
	api.Event_POST_START_CONTAINER:    "nri.post_start_container",
	api.Event_UPDATE_CONTAINER:        "nri.update_container",
	api.Event_POST_UPDATE_CONTAINER:   "nri.post_update_container",
	api.Event_STOP_CONTAINER:          "nri.stop_container",
	api.Event_REMOVE_CONTAINER:        "nri.remove_container",
}

// startHook starts the span of hook ev for pod p and, when c is not nil, container c.
func startHook(ctx context.Context, ev api.Event, p *Pod, c *Container) (context.Context, trace.Span) {
	ctx, span := tracing.Start(ctx, hookSpanNames[ev])
	if span.IsRecording() {
		span.SetAttributes(attrSandboxID.String(p.ID), attrPodName.String(p.Name), attrPodNamespace.String(p.Namespace))
		if c != nil {
			span.SetAttributes(attrContainerID.String(c.ID), attrContainerName.String(c.Name))
		}
	}
	return ctx, span
}

// enter is called right before a call into the library for hook ev under ctx, leave
// right after it: between the two, the library's reports of its plugins are those of
// this call. It returns nil, after taking hookMu all the same (see the comment at the
// top), when ctx is not traced.
func (n *NRI) enter(ctx context.Context, ev api.Event) *pluginSpans {
	n.hookMu.Lock()
	if !tracing.Traced(ctx) {
		return nil
	}
	ps := &pluginSpans{ctx: ctx, op: ev.PrettyName(), open: map[string]*openPlugin{}}
	n.cur.Store(ps)
	return ps
}

func (n *NRI) leave(ps *pluginSpans) {
	if ps != nil {
		n.cur.Store(nil)
		ps.end()
	}
	n.hookMu.Unlock()
}

// pluginSpans are the nri.plugin spans of one traced hook.
type pluginSpans struct {
	ctx context.Context // the hook's span
	op  string          // the library's name of the hook's event

	mu         sync.Mutex
	open       map[string]*openPlugin // by plugin name and event
	plugins    int
	validators int
}

// openPlugin is a plugin's span, open until the hook ends so that the library's later
// reports (its error, its adjustment) land on it; it ends at the time it answered.
type openPlugin struct {
	span trace.Span
	at   time.Time
}

// accepts reports whether a report of event op belongs to the hook: a plugin
// registering meanwhile reports its Synchronize, which does not.
func (ps *pluginSpans) accepts(op string) bool {
	return op == ps.op || (op == opValidation && ps.op == api.Event_CREATE_CONTAINER.PrettyName())
}

func (ps *pluginSpans) get(name, op string) *openPlugin {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.open[name+"/"+op]
}

// add opens the span of plugin name, which answered event op now, after latency.
func (ps *pluginSpans) add(name, op string, latency time.Duration) {
	now := time.Now()
	attrs := []attribute.KeyValue{attrPluginName.String(name), attrHook.String(op)}
	if idx, _, ok := strings.Cut(name, "-"); ok && len(idx) == 2 {
		attrs = append(attrs, attrPluginIndex.String(idx))
	}
	// Started after the fact, at the time the library measured: the span API's Start
	// has no timestamp, so the parent's provider is used as tracing.Start uses it.
	_, span := trace.SpanFromContext(ps.ctx).TracerProvider().Tracer(tracing.Scope).Start(ps.ctx, spanPlugin,
		trace.WithTimestamp(now.Add(-latency)), trace.WithAttributes(attrs...))
	ps.mu.Lock()
	defer ps.mu.Unlock()
	key := name + "/" + op
	if prev := ps.open[key]; prev != nil {
		prev.span.End(trace.WithTimestamp(prev.at))
	}
	ps.open[key] = &openPlugin{span: span, at: now}
	if op == opValidation {
		ps.validators++
	} else {
		ps.plugins++
	}
}

// end ends the plugin spans and records the count of plugins and validators on the
// hook's span.
func (ps *pluginSpans) end() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, o := range ps.open {
		o.span.End(trace.WithTimestamp(o.at))
	}
	span := trace.SpanFromContext(ps.ctx)
	span.SetAttributes(attrPlugins.Int(ps.plugins))
	if ps.validators > 0 {
		span.SetAttributes(attrValidators.Int(ps.validators))
	}
}

// pluginReports is the library's Metrics: it turns the reports of each plugin's
// answer into the plugin's span of the hook under way.
type pluginReports struct{ n *NRI }

var _ adaptation.Metrics = pluginReports{}

// RecordPluginLatency opens the plugin's span, timed as the library timed the call.
func (r pluginReports) RecordPluginLatency(name, op string, latency time.Duration) {
	if ps := r.n.cur.Load(); ps != nil && ps.accepts(op) {
		ps.add(name, op, latency)
	}
}

// RecordPluginInvocation marks the plugin's span failed when the call failed.
func (r pluginReports) RecordPluginInvocation(name, op string, err error) {
	if err == nil {
		return
	}
	if ps := r.n.cur.Load(); ps != nil && ps.accepts(op) {
		if o := ps.get(name, op); o != nil {
			o.span.RecordError(err)
			o.span.SetStatus(codes.Error, err.Error())
		}
	}
}

// RecordPluginAdjustments counts what the plugin asked for on its span.
func (r pluginReports) RecordPluginAdjustments(name, op string, adjust *adaptation.ContainerAdjustment, updates, evicts int) {
	if ps := r.n.cur.Load(); ps != nil && ps.accepts(op) {
		if o := ps.get(name, op); o != nil {
			o.span.SetAttributes(attrAdjustments.Int(countAdjustments(adjust)), attrUpdates.Int(updates), attrEvictions.Int(evicts))
		}
	}
}

// UpdatePluginCount is not traced.
func (pluginReports) UpdatePluginCount(int) {}

// countAdjustments counts what an adjustment changes: each value it sets, each entry
// of its lists and maps (an environment variable, a mount, a hook, an annotation),
// within the messages it sets as well; a message set but empty counts nothing.
func countAdjustments(adj *api.ContainerAdjustment) int {
	if adj == nil {
		return 0
	}
	return countSet(adj.ProtoReflect())
}

func countSet(m protoreflect.Message) int {
	n := 0
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			n += v.List().Len()
		case fd.IsMap():
			n += v.Map().Len()
		case fd.Message() != nil:
			n += countSet(v.Message())
		default:
			n++
		}
		return true
	})
	return n
}

// ttrpcOptions are the library's ttrpc client options: calls to a plugin carry the
// trace context, as containerd's otelttrpc interceptors make them.
func ttrpcOptions() adaptation.Option {
	inner := otelttrpc.UnaryClientInterceptor(otelttrpc.WithTracerProvider(parentProvider{}),
		otelttrpc.WithPropagators(propagation.TraceContext{}))
	client := func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoker ttrpc.Invoker) error {
		if !trace.SpanContextFromContext(ctx).IsSampled() {
			return invoker(ctx, req, resp)
		}
		return inner(ctx, req, resp, info, func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response) error {
			err := invoker(ctx, req, resp)
			// ttrpc turns the plugin's error status into an error only after the
			// interceptors ran: otelttrpc would see a failed call as a success.
			if st := resp.GetStatus(); err == nil && st.GetCode() != 0 {
				trace.SpanFromContext(ctx).SetStatus(codes.Error, st.GetMessage())
			}
			return err
		})
	}
	return adaptation.WithTTRPCOptions([]ttrpc.ClientOpts{ttrpc.WithUnaryClientInterceptor(client)}, nil)
}

// parentProvider starts each span with the provider of its parent, the span in the
// context, as tracing.Start does: NRI has no provider of its own, and a call without a
// traced parent gets the no-op span.
type parentProvider struct{ embedded.TracerProvider }

// Tracer returns a tracer that defers to the parent's provider at each span's start.
func (parentProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return parentTracer{name: name, opts: opts}
}

type parentTracer struct {
	embedded.Tracer
	name string
	opts []trace.TracerOption
}

// Start starts the span with the parent's provider.
func (t parentTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(t.name, t.opts...).Start(ctx, name, opts...)
}
