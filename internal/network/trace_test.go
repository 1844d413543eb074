package network

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// traced starts a root span of a test provider that exports synchronously into memory.
func traced(t *testing.T) (context.Context, trace.Span, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, root := tp.Tracer("test").Start(context.Background(), "root")
	return ctx, root, exp
}

// spanTree renders the spans under root, one a line, indented by depth, children in
// the order they started: name, the values of keys the span has, and "ERROR" for an
// error status.
func spanTree(spans tracetest.SpanStubs, root trace.SpanContext, keys ...attribute.Key) string {
	var b strings.Builder
	var walk func(parent trace.SpanID, depth int)
	walk = func(parent trace.SpanID, depth int) {
		var kids tracetest.SpanStubs
		for _, s := range spans {
			if s.Parent.SpanID() == parent && s.SpanContext.TraceID() == root.TraceID() {
				kids = append(kids, s)
			}
		}
		slices.SortStableFunc(kids, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
		for _, s := range kids {
			b.WriteString(strings.Repeat("  ", depth) + s.Name)
			for _, k := range keys {
				for _, a := range s.Attributes {
					if a.Key == k {
						fmt.Fprintf(&b, " %s=%s", k, a.Value.String())
					}
				}
			}
			if s.Status.Code == codes.Error {
				b.WriteString(" ERROR")
			}
			b.WriteString("\n")
			walk(s.SpanContext.SpanID(), depth+1)
		}
	}
	walk(root.SpanID(), 0)
	return b.String()
}

func checkTree(t *testing.T, exp *tracetest.InMemoryExporter, root trace.Span, want string, keys ...attribute.Key) tracetest.SpanStubs {
	t.Helper()
	spans := exp.GetSpans()
	got := spanTree(spans, root.SpanContext(), keys...)
	want = strings.TrimLeft(want, "\n")
	if got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
	return spans
}

func findSpan(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %s", name)
	return tracetest.SpanStub{}
}

func attrOf(s tracetest.SpanStub, k attribute.Key) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value.String()
		}
	}
	return ""
}

// TestTraceAddDel: an ADD of a two-plugin list is cni.add with a cni.plugin child per
// plugin in the list's order; the DEL is cni.del with the plugins backwards.
func TestTraceAddDel(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-one", "crisp-two")
	ctx, root, exp := traced(t)
	p := fakePod()
	p.UID = "uid-1"
	p.PortMappings = []PortMapping{{HostPort: 8080, ContainerPort: 80}, {ContainerPort: 81}}
	if _, err := f.m.Setup(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Teardown(ctx, p); err != nil {
		t.Fatal(err)
	}
	root.End()
	spans := checkTree(t, exp, root, `
cni.add crisp.cni.network=fakenet
  cni.plugin crisp.cni.plugin.type=crisp-one crisp.cni.command=ADD
  cni.plugin crisp.cni.plugin.type=crisp-two crisp.cni.command=ADD
cni.del crisp.cni.network=fakenet
  cni.plugin crisp.cni.plugin.type=crisp-two crisp.cni.command=DEL
  cni.plugin crisp.cni.plugin.type=crisp-one crisp.cni.command=DEL
`, attrNetwork, attrPluginType, attrCommand)
	add := findSpan(t, spans, spanAdd)
	for k, want := range map[attribute.Key]string{
		attrSandboxID: p.ID, attrNetNS: p.NetNS, attrPodName: "p", attrPodNamespace: "ns", attrPodUID: "uid-1",
		attrPlugins: "2", attrPortMappings: "1", attrPodIP: "10.99.0.2",
	} {
		if got := attrOf(add, k); got != want {
			t.Errorf("cni.add %s = %q, want %q", k, got, want)
		}
	}
	plugin := findSpan(t, spans, spanPlugin)
	if ips, ifs := attrOf(plugin, attrResultIPs), attrOf(plugin, attrResultIfs); ips != "1" || ifs != "1" {
		t.Errorf("ADD plugin result: %s IPs, %s interfaces", ips, ifs)
	}
	// The fake netns is no namespace: DEL runs without it, and the span says so.
	del := findSpan(t, spans, spanDel)
	if attrOf(del, attrSandboxID) != p.ID || attrOf(del, attrNetNS) != "" {
		t.Errorf("cni.del attributes: %v", del.Attributes)
	}
}

// TestTraceAddFailure: a failing plugin marks its span and cni.add with an error; the
// DEL that undoes the ADD is a child of cni.add.
func TestTraceAddFailure(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-ok", "crisp-fail")
	f.set("crisp-fail", "ADD", "fail")
	ctx, root, exp := traced(t)
	if _, err := f.m.Setup(ctx, fakePod()); err == nil {
		t.Fatal("Setup with a failing plugin succeeded")
	}
	root.End()
	spans := checkTree(t, exp, root, `
cni.add ERROR
  cni.plugin crisp.cni.plugin.type=crisp-ok crisp.cni.command=ADD
  cni.plugin crisp.cni.plugin.type=crisp-fail crisp.cni.command=ADD crisp.cni.error.code=11 ERROR
  cni.del
    cni.plugin crisp.cni.plugin.type=crisp-fail crisp.cni.command=DEL
    cni.plugin crisp.cni.plugin.type=crisp-ok crisp.cni.command=DEL
`, attrPluginType, attrCommand, attrErrorCode)
	for _, s := range spans {
		if s.Status.Code == codes.Error && !strings.Contains(s.Status.Description, "injected failure") {
			t.Errorf("%s status %q does not say why", s.Name, s.Status.Description)
		}
	}
}

// TestTraceAddTimeout: a plugin killed at the CNI timeout has an error status that
// says so, and so has cni.add.
func TestTraceAddTimeout(t *testing.T) {
	f := newFakeNet(t, 300*time.Millisecond, "crisp-hang")
	f.set("crisp-hang", "ADD", "hang")
	ctx, root, exp := traced(t)
	if _, err := f.m.Setup(ctx, fakePod()); err == nil {
		t.Fatal("Setup with a hanging plugin succeeded")
	}
	assertGone(t, f.hungPids("crisp-hang"))
	root.End()
	spans := checkTree(t, exp, root, `
cni.add ERROR
  cni.plugin crisp.cni.command=ADD ERROR
  cni.del
    cni.plugin crisp.cni.command=DEL
`, attrCommand)
	for _, s := range spans {
		if s.Status.Code == codes.Error && !strings.Contains(s.Status.Description, "cni.timeout_seconds") {
			t.Errorf("%s status %q does not name the timeout", s.Name, s.Status.Description)
		}
	}
}

// TestTraceDelPluginByPlugin: a failed DEL retried plugin by plugin stays one cni.del
// with every run under it, and the failure on it.
func TestTraceDelPluginByPlugin(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-ok", "crisp-fail")
	p := fakePod()
	if _, err := f.m.Setup(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	f.set("crisp-fail", "DEL", "fail")
	ctx, root, exp := traced(t)
	if err := f.m.Teardown(ctx, p); err == nil {
		t.Fatal("Teardown with a failing plugin succeeded")
	}
	root.End()
	checkTree(t, exp, root, `
cni.del ERROR
  cni.plugin crisp.cni.plugin.type=crisp-fail ERROR
  cni.plugin crisp.cni.plugin.type=crisp-fail ERROR
  cni.plugin crisp.cni.plugin.type=crisp-ok
`, attrPluginType)
}

// TestUntracedRecordsNothing: without a span in the context the operations work and
// nothing is recorded, and the tracing added to the path allocates nothing.
func TestUntracedRecordsNothing(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-one", "crisp-two")
	_, root, exp := traced(t)
	p := fakePod()
	if _, err := f.m.Setup(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Teardown(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	root.End()
	if spans := exp.GetSpans(); len(spans) != 1 {
		t.Errorf("untraced Setup and Teardown recorded %d spans besides the test's root", len(spans)-1)
	}
	list := &libcni.NetworkConfigList{Name: "n"}
	rt := runtimeConf(p)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		_, span := startOp(ctx, spanDel, list, rt)
		setPodAttrs(span, p)
		tracing.End(span, nil)
		_, span = tracing.Start(ctx, spanPlugin)
		tracing.End(span, nil)
	})
	if allocs != 0 {
		t.Errorf("untraced spans allocate %v times", allocs)
	}
}
