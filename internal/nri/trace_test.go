package nri

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/containerd/otelttrpc"
	"github.com/containerd/ttrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/tracing/tracingtest"
)

// tracedPlugin adjusts (or not) at CreateContainer, refuses StartContainer if told,
// and keeps the traceparent each CreateContainer carried.
type tracedPlugin struct {
	*syncer
	adjust    bool
	failStart bool

	mu           sync.Mutex
	traceparents []string
}

func (p *tracedPlugin) CreateContainer(ctx context.Context, _ *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	tp, _ := ttrpc.GetMetadataValue(ctx, "traceparent")
	p.mu.Lock()
	p.traceparents = append(p.traceparents, tp)
	p.mu.Unlock()
	adj := &api.ContainerAdjustment{}
	if p.adjust {
		adj.AddEnv("TRACED", "yes")
		adj.AddAnnotation("nri.test/traced", "yes")
	}
	return adj, nil, nil
}

func (p *tracedPlugin) StartContainer(context.Context, *api.PodSandbox, *api.Container) error {
	if p.failStart {
		return errors.New("refused by the test")
	}
	return nil
}

func (p *tracedPlugin) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.traceparents)
}

// pluginTracing makes a test plugin trace its calls with tr's provider: a server span
// joining the trace context the call carries.
func pluginTracing(tr *tracingtest.Tracer) stub.Option {
	return stub.WithTTRPCOptions(nil, []ttrpc.ServerOpt{ttrpc.WithUnaryServerInterceptor(otelttrpc.UnaryServerInterceptor(
		otelttrpc.WithTracerProvider(tr.Provider()), otelttrpc.WithPropagators(propagation.TraceContext{})))})
}

// crispSpans keeps crisp's own spans in a tree; the ttrpc client and server spans are
// checked apart.
var crispSpans = tracingtest.Only(func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindInternal })

func tracedContainer(id string) Container {
	return Container{ID: id, PodID: "p", Name: id, Spec: testSpec()}
}

// TestTraceHooks: a hook is one span with a child per plugin, in the order the
// library called them, each with what it asked for; the call to each plugin carries
// the trace context, so a plugin that traces joins the trace under the hook.
func TestTraceHooks(t *testing.T) {
	tr := tracingtest.NewTracer(t)
	cfg := testConfig(t)
	n := startNRI(t, cfg, newTestRuntime())
	first := &tracedPlugin{syncer: newSyncer(), adjust: true}
	second := &tracedPlugin{syncer: newSyncer(), failStart: true}
	startPlugin(t, n, cfg.SocketPath, "first", "10", first)
	startPlugin(t, n, cfg.SocketPath, "second", "20", second, pluginTracing(tr))

	ctx, root := tr.Root("kubelet")
	pod := Pod{ID: "p", Name: "pod", Namespace: "ns"}
	if _, err := n.CreateContainer(ctx, pod, tracedContainer("c")); err != nil {
		t.Fatal(err)
	}
	if err := n.StartContainer(ctx, pod, tracedContainer("c")); err == nil {
		t.Fatal("StartContainer refused by a plugin succeeded")
	}
	root.End()
	tr.Check(t, root, `
nri.create_container crisp.nri.plugins=2 crisp.nri.adjustments=2 crisp.nri.rejected=false
  nri.plugin crisp.nri.plugin.name=10-first crisp.nri.plugin.index=10 crisp.nri.hook=CreateContainer crisp.nri.adjustments=2
  nri.plugin crisp.nri.plugin.name=20-second crisp.nri.plugin.index=20 crisp.nri.hook=CreateContainer crisp.nri.adjustments=0
nri.start_container crisp.nri.plugins=2 ERROR
  nri.plugin crisp.nri.plugin.name=10-first crisp.nri.plugin.index=10 crisp.nri.hook=StartContainer
  nri.plugin crisp.nri.plugin.name=20-second crisp.nri.plugin.index=20 crisp.nri.hook=StartContainer ERROR
`, crispSpans, tracingtest.Keys(attrPlugins, attrPluginName, attrPluginIndex, attrHook, attrAdjustments, attrRejected))

	// The hook's span names the pod and container; each plugin's span lies within it.
	create := tr.Find(t, root, "nri.create_container")
	for k, want := range map[attribute.Key]string{attrSandboxID: "p", attrPodName: "pod", attrPodNamespace: "ns", attrContainerID: "c", attrContainerName: "c"} {
		if got := tracingtest.Attr(create, k); got != want {
			t.Errorf("nri.create_container %s = %q, want %q", k, got, want)
		}
	}
	for _, s := range tr.Ended() {
		if s.Name() == spanPlugin && s.Parent().SpanID() == create.SpanContext().SpanID() &&
			(s.StartTime().Before(create.StartTime()) || s.EndTime().After(create.EndTime())) {
			t.Errorf("plugin span %s–%s outside its hook's %s–%s", s.StartTime(), s.EndTime(), create.StartTime(), create.EndTime())
		}
	}

	// Propagation: each plugin got the trace's context; the one that traces made its
	// server span a child of the runtime's ttrpc client span under the hook.
	for _, p := range []*tracedPlugin{first, second} {
		if seen := p.seen(); len(seen) != 1 || !strings.Contains(seen[0], root.SpanContext().TraceID().String()) {
			t.Errorf("traceparents a plugin saw: %q", seen)
		}
	}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range tr.Ended() {
		byID[s.SpanContext().SpanID()] = s
	}
	servers := 0
	for _, s := range tr.Ended() {
		if s.SpanKind() != trace.SpanKindServer || !strings.HasSuffix(s.Name(), "/CreateContainer") {
			continue
		}
		servers++
		client := byID[s.Parent().SpanID()]
		if client == nil || client.SpanKind() != trace.SpanKindClient || client.Parent().SpanID() != create.SpanContext().SpanID() {
			t.Errorf("the plugin's server span is not under a ttrpc client span of the hook: parent %v", client)
		}
	}
	if servers != 1 {
		t.Errorf("%d server spans of the tracing plugin's CreateContainer", servers)
	}
}

// TestTraceValidation: each validator is a child of the create, the built-in default
// validator included; its refusal fails the create's span. The library reports a
// validator's answer, not its verdict, so the validator's own span has no error.
func TestTraceValidation(t *testing.T) {
	tr := tracingtest.NewTracer(t)
	cfg := testConfig(t)
	cfg.DefaultValidator = config.NRIValidatorConfig{Enable: true, RejectOCIHookAdjustment: true}
	n := startNRI(t, cfg, newTestRuntime())
	startPlugin(t, n, cfg.SocketPath, "hooker", "10", &adjustBy{syncer: newSyncer(), adj: addHook})
	ctx, root := tr.Root("kubelet")
	if _, err := n.CreateContainer(ctx, Pod{ID: "p"}, tracedContainer("c")); err == nil {
		t.Fatal("a refused adjustment succeeded")
	}
	root.End()
	tr.Check(t, root, `
nri.create_container crisp.nri.adjustments=0 crisp.nri.rejected=true crisp.nri.validators=1 ERROR
  nri.plugin crisp.nri.plugin.name=10-hooker crisp.nri.hook=CreateContainer crisp.nri.adjustments=1
  nri.plugin crisp.nri.plugin.name=00-default-validator crisp.nri.hook=ValidateContainerAdjustment
`, crispSpans, tracingtest.Keys(attrPluginName, attrHook, attrAdjustments, attrRejected, attrValidators))
}

// TestTraceUntraced: without a span in the context hooks work, nothing is recorded and
// no trace context goes to plugins.
func TestTraceUntraced(t *testing.T) {
	tr := tracingtest.NewTracer(t)
	cfg := testConfig(t)
	n := startNRI(t, cfg, newTestRuntime())
	p := &tracedPlugin{syncer: newSyncer(), adjust: true}
	startPlugin(t, n, cfg.SocketPath, "plain", "10", p, pluginTracing(tr))
	ctx := context.Background()
	pod := Pod{ID: "p"}
	if _, err := n.CreateContainer(ctx, pod, tracedContainer("c")); err != nil {
		t.Fatal(err)
	}
	if err := n.StartContainer(ctx, pod, tracedContainer("c")); err != nil {
		t.Fatal(err)
	}
	n.RemoveContainer(ctx, pod, tracedContainer("c"))
	// The plugin's own server spans are roots of their own: no context came with the calls.
	for _, s := range tr.Ended() {
		if s.SpanKind() != trace.SpanKindServer || s.Parent().IsValid() {
			t.Errorf("untraced hooks recorded %s (kind %v, parent %v)", s.Name(), s.SpanKind(), s.Parent().SpanID())
		}
	}
	if seen := p.seen(); len(seen) != 1 || seen[0] != "" {
		t.Errorf("an untraced call carried trace context: %q", seen)
	}
	if n.cur.Load() != nil {
		t.Error("a hook is still routed after the calls ended")
	}
}
