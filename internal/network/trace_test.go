package network

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/crisp-runtime/crisp/internal/tracing"
	"github.com/crisp-runtime/crisp/internal/tracing/tracingtest"
)

// TestTraceAddDel: an ADD of a two-plugin list is cni.add with a cni.plugin child per
// plugin in the list's order; the DEL is cni.del with the plugins backwards.
func TestTraceAddDel(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-one", "crisp-two")
	tr := tracingtest.NewTracer(t)
	ctx, root := tr.Root("root")
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
	tr.Check(t, root, `
cni.add crisp.cni.network=fakenet
  cni.plugin crisp.cni.plugin.type=crisp-one crisp.cni.command=ADD
  cni.plugin crisp.cni.plugin.type=crisp-two crisp.cni.command=ADD
cni.del crisp.cni.network=fakenet
  cni.plugin crisp.cni.plugin.type=crisp-two crisp.cni.command=DEL
  cni.plugin crisp.cni.plugin.type=crisp-one crisp.cni.command=DEL
`, tracingtest.Keys(attrNetwork, attrPluginType, attrCommand))
	add := tr.Find(t, root, spanAdd)
	for k, want := range map[attribute.Key]string{
		attrSandboxID: p.ID, attrNetNS: p.NetNS, attrPodName: "p", attrPodNamespace: "ns", attrPodUID: "uid-1",
		attrPlugins: "2", attrPortMappings: "1", attrPodIP: "10.99.0.2",
	} {
		if got := tracingtest.Attr(add, k); got != want {
			t.Errorf("cni.add %s = %q, want %q", k, got, want)
		}
	}
	plugin := tr.Find(t, root, spanPlugin)
	if ips, ifs := tracingtest.Attr(plugin, attrResultIPs), tracingtest.Attr(plugin, attrResultIfs); ips != "1" || ifs != "1" {
		t.Errorf("ADD plugin result: %s IPs, %s interfaces", ips, ifs)
	}
	// The fake netns is no namespace: DEL runs without it, and the span says so.
	del := tr.Find(t, root, spanDel)
	if tracingtest.Attr(del, attrSandboxID) != p.ID || tracingtest.Attr(del, attrNetNS) != "" {
		t.Errorf("cni.del attributes: %v", del.Attributes())
	}
}

// TestTraceAddFailure: a failing plugin marks its span and cni.add with an error; the
// DEL that undoes the ADD is a child of cni.add.
func TestTraceAddFailure(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-ok", "crisp-fail")
	f.set("crisp-fail", "ADD", "fail")
	tr := tracingtest.NewTracer(t)
	ctx, root := tr.Root("root")
	if _, err := f.m.Setup(ctx, fakePod()); err == nil {
		t.Fatal("Setup with a failing plugin succeeded")
	}
	root.End()
	tr.Check(t, root, `
cni.add ERROR
  cni.plugin crisp.cni.plugin.type=crisp-ok crisp.cni.command=ADD
  cni.plugin crisp.cni.plugin.type=crisp-fail crisp.cni.command=ADD crisp.cni.error.code=11 ERROR
  cni.del
    cni.plugin crisp.cni.plugin.type=crisp-fail crisp.cni.command=DEL
    cni.plugin crisp.cni.plugin.type=crisp-ok crisp.cni.command=DEL
`, tracingtest.Keys(attrPluginType, attrCommand, attrErrorCode))
	for _, s := range tr.Spans(root) {
		if s.Status().Code == codes.Error && !strings.Contains(s.Status().Description, "injected failure") {
			t.Errorf("%s status %q does not say why", s.Name(), s.Status().Description)
		}
	}
}

// TestTraceAddTimeout: a plugin killed at the CNI timeout has an error status that
// says so, and so has cni.add.
func TestTraceAddTimeout(t *testing.T) {
	f := newFakeNet(t, 300*time.Millisecond, "crisp-hang")
	f.set("crisp-hang", "ADD", "hang")
	tr := tracingtest.NewTracer(t)
	ctx, root := tr.Root("root")
	if _, err := f.m.Setup(ctx, fakePod()); err == nil {
		t.Fatal("Setup with a hanging plugin succeeded")
	}
	assertGone(t, f.hungPids("crisp-hang"))
	root.End()
	tr.Check(t, root, `
cni.add ERROR
  cni.plugin crisp.cni.command=ADD ERROR
  cni.del
    cni.plugin crisp.cni.command=DEL
`, tracingtest.Keys(attrCommand))
	for _, s := range tr.Spans(root) {
		if s.Status().Code == codes.Error && !strings.Contains(s.Status().Description, "cni.timeout_seconds") {
			t.Errorf("%s status %q does not name the timeout", s.Name(), s.Status().Description)
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
	tr := tracingtest.NewTracer(t)
	ctx, root := tr.Root("root")
	if err := f.m.Teardown(ctx, p); err == nil {
		t.Fatal("Teardown with a failing plugin succeeded")
	}
	root.End()
	tr.Check(t, root, `
cni.del ERROR
  cni.plugin crisp.cni.plugin.type=crisp-fail ERROR
  cni.plugin crisp.cni.plugin.type=crisp-fail ERROR
  cni.plugin crisp.cni.plugin.type=crisp-ok
`, tracingtest.Keys(attrPluginType))
}

// TestUntracedRecordsNothing: without a span in the context the operations work and
// nothing is recorded, and the tracing added to the path allocates nothing.
func TestUntracedRecordsNothing(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-one", "crisp-two")
	tr := tracingtest.NewTracer(t)
	_, root := tr.Root("root")
	p := fakePod()
	if _, err := f.m.Setup(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Teardown(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	root.End()
	if spans := tr.Ended(); len(spans) != 1 {
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
