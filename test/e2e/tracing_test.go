package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/tracing/otlptest"
)

// callerTrace is a trace context as kubelet sends it: a W3C traceparent in the gRPC
// metadata, for a sampled span of a trace of its own.
func callerTrace(ctx context.Context, t *testing.T) (context.Context, string, string) {
	t.Helper()
	tid, sid := make([]byte, 16), make([]byte, 8)
	if _, err := rand.Read(tid); err != nil {
		t.Fatal(err)
	}
	if _, err := rand.Read(sid); err != nil {
		t.Fatal(err)
	}
	traceID, spanID := hex.EncodeToString(tid), hex.EncodeToString(sid)
	return metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-"+spanID+"-01"), traceID, spanID
}

// kubeletTracer is the tracer provider kubelet runs with tracing on: the SDK with an
// OTLP/gRPC exporter, service.name kubelet. Shutting it down flushes its spans.
func kubeletTracer(ctx context.Context, t *testing.T, endpoint string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "kubelet"))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// TestE2ETracing drives a pod start with kubelet's own CRI client (k8s.io/cri-client,
// instrumented with otelgrpc and given a tracer provider as kubelet gives it) under a
// kubelet span, with tracing on and an OTLP receiver in the test, and checks the one
// trace: every CRI call is a server span child of kubelet's client span, the shim's
// spans (sandbox and task calls, the runc helper, the container's exit) are in the
// same trace, each parented to the controller's ttrpc client span; failed calls are
// marked. A criserver with tracing off exports nothing.
func TestE2ETracing(t *testing.T) {
	recv, err := otlptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(recv.Close)
	e := newEnv(t)
	e.appendConfig(fmt.Sprintf("[tracing]\nenable = true\nendpoint = %q\ninsecure = true\n", recv.GRPCAddr))
	e.start()
	ctx := ctxT(t)
	// A fresh store downloads, unpacks and commits the layer; a node's may hold it.
	podID, trace := tracedPodStart(ctx, t, e, recv, e.podConfig("traced"),
		"image.layer.download", "image.layer.unpack", "image.layer.commit")
	for _, s := range trace {
		if s.Name == "shim.cgroup.apply" && s.Attrs["crisp.cgroup.driver"] != "cgroupfs" {
			t.Errorf("shim.cgroup.apply attributes %v, want the cgroupfs driver", s.Attrs)
		}
	}
	e.stopRemove(ctx, t, podID)

	t.Run("off", func(t *testing.T) {
		off := newEnv(t)
		off.appendConfig(fmt.Sprintf("[tracing]\nenable = false\nendpoint = %q\ninsecure = true\n", recv.GRPCAddr))
		off.start()
		before := recv.Exports()
		octx, offTrace, _ := callerTrace(ctx, t)
		id := off.runPod(octx, off.podConfig("untraced"))
		off.stopRemove(octx, t, id)
		off.stop()
		if n := len(recv.Trace(offTrace)); n != 0 || recv.Exports() != before {
			t.Errorf("tracing off: %d spans of its trace, %d exports (before %d)", n, recv.Exports(), before)
		}
	})
}

// tracedPodStart pulls an image, runs pod cfg and a container that exits 3 with
// kubelet's own CRI client (k8s.io/cri-client, instrumented with otelgrpc and given a
// tracer provider as kubelet gives it) under a kubelet span, makes two failing calls,
// and checks the trace recv gets: the spans every pod start has, and extra; every CRI
// call a server span child of kubelet's client span; the shim's spans in the same
// trace, each parented to the controller's ttrpc client span; failed calls marked. It
// returns the pod and the trace.
func tracedPodStart(ctx context.Context, t *testing.T, e *env, recv *otlptest.Receiver, cfg *cri.PodSandboxConfig, extra ...string) (podID string, trace []otlptest.Span) {
	t.Helper()
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "busybox:e2e", imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip))
	img := host + "/busybox:e2e"

	tp := kubeletTracer(ctx, t, recv.GRPCAddr)
	rt, err := criclient.NewRemoteRuntimeServiceBuilder().WithEndpoint("unix://" + e.socket).
		WithConnectionTimeout(time.Minute).WithTracerProvider(tp).Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	is, err := criclient.NewRemoteImageServiceBuilder().WithEndpoint("unix://" + e.socket).
		WithConnectionTimeout(time.Minute).WithTracerProvider(tp).Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tctx, root := tp.Tracer("kubelet").Start(ctx, "SyncPod")
	traceID := root.SpanContext().TraceID().String()
	if _, err := is.PullImage(tctx, &cri.ImageSpec{Image: img}, nil, cfg); err != nil {
		t.Fatal(err)
	}
	podID, err = rt.RunPodSandbox(tctx, cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := rt.CreateContainer(tctx, podID, ctrConfig("traced", img, "sh", "-c", "exit 3"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.StartContainer(tctx, ctr); err != nil {
		t.Fatal(err)
	}
	e.waitExit(ctx, ctr, 30*time.Second)
	// Failing calls: the server span carries the gRPC code, and a server-side failure
	// (Unavailable: a registry that does not answer) the error status, as the gRPC
	// semantic conventions ask (a caller's NotFound is no error of the server's).
	if err := rt.StartContainer(tctx, strings.Repeat("0", 64)); err == nil {
		t.Fatal("StartContainer of an unknown container succeeded")
	}
	if _, err := is.PullImage(tctx, &cri.ImageSpec{Image: imagetest.ClosedAddr(t) + "/nothing:here"}, nil, cfg); status.Code(err) != codes.Unavailable {
		t.Fatalf("pull from a closed port: %v, want Unavailable", err)
	}
	root.End()

	want := []string{
		"runtime.v1.ImageService/PullImage", "runtime.v1.RuntimeService/RunPodSandbox",
		"runtime.v1.RuntimeService/CreateContainer", "runtime.v1.RuntimeService/StartContainer",
		"controller.shim.start", "cri.container.rootfs", "cri.container.spec",
		"containerd.runtime.sandbox.v1.Sandbox/CreateSandbox", "containerd.runtime.sandbox.v1.Sandbox/StartSandbox",
		"containerd.task.v3.Task/Create", "containerd.task.v3.Task/Start", "shim.helper", "shim.container.exit",
		"shim.pause.start", "shim.cgroup.apply", "cni.add", "cni.plugin", "image.pull", "image.layer",
	}
	want = append(want, extra...)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// criserver's spans come in batches (every 5 s) and the shim's through the relay,
	// in any order: the trace is complete once every wanted span is there, every span's
	// parent is, and every call kubelet made has crisp's server span under it.
	spans, err := recv.WaitFor(wctx, func(all []otlptest.Span) bool {
		have, ids, served := map[string]bool{}, map[string]bool{}, map[string]bool{}
		for _, s := range all {
			if s.TraceID == traceID {
				have[s.Name], ids[s.SpanID] = true, true
				if s.Service == "crisp" {
					served[s.ParentID] = true
				}
			}
		}
		for _, n := range want {
			if !have[n] {
				return false
			}
		}
		for _, s := range all {
			if s.TraceID != traceID {
				continue
			}
			if s.ParentID != "" && !ids[s.ParentID] {
				return false
			}
			if s.Service == "kubelet" && strings.HasPrefix(s.Name, "runtime.v1.") && !served[s.SpanID] {
				return false
			}
		}
		return true
	})
	trace = recv.Trace(traceID)
	t.Logf("trace %s (%d spans):\n%s", traceID, len(trace), otlptest.Tree(trace))
	if err != nil {
		t.Fatalf("spans missing after 30 s (received %d in all): %v", len(spans), err)
	}
	byID := map[string]otlptest.Span{}
	for _, s := range trace {
		byID[s.SpanID] = s
	}
	var notFound, failedPull bool
	for _, s := range trace {
		switch {
		case s.Service == "kubelet":
		case strings.HasPrefix(s.Name, "runtime.v1."):
			if client := byID[s.ParentID]; s.Service != "crisp" || client.Service != "kubelet" || client.Name != s.Name {
				t.Errorf("CRI span %s [%s]: parent %+v; want kubelet's client span of the call", s.Name, s.Service, client)
			}
			if s.Name == "runtime.v1.RuntimeService/StartContainer" && s.Attrs["rpc.response.status_code"] == "NOT_FOUND" && !s.Failed {
				notFound = true
			}
			if s.Name == "runtime.v1.ImageService/PullImage" && s.Failed && s.Attrs["rpc.response.status_code"] == "UNAVAILABLE" {
				failedPull = true
			}
		case s.Service == "crisp-shim":
			if s.Attrs["rpc.system"] == "ttrpc" {
				client, ok := byID[s.ParentID]
				if !ok || client.Service != "crisp" || client.Name != s.Name {
					t.Errorf("shim span %s: parent %+v, want the controller's client span of the same call", s.Name, client)
				}
			} else if _, ok := byID[s.ParentID]; !ok {
				t.Errorf("shim span %s has no parent in the trace", s.Name)
			}
		default:
			if _, ok := byID[s.ParentID]; !ok {
				t.Errorf("span %s [%s] has no parent in the trace", s.Name, s.Service)
			}
		}
		if s.Name == "shim.container.exit" && s.Attrs["crisp.exit_status"] != "3" {
			t.Errorf("exit span attributes %v, want crisp.exit_status 3", s.Attrs)
		}
	}
	if !notFound || !failedPull {
		t.Errorf("failed calls' spans: StartContainer NOT_FOUND found %v, PullImage failed UNAVAILABLE found %v", notFound, failedPull)
	}
	return podID, trace
}
