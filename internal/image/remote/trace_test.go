package remote

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/image/sigpolicy"
	"github.com/crisp-runtime/crisp/internal/tracing/tracingtest"
)

// pulledTree is what a pull of a two-layer image that downloads everything records
// under the caller's span; at is what the spans that reach the endpoint show of it.
func pulledTree(at string) string {
	return strings.ReplaceAll(`image.config
  image.blob.download@
image.layer crisp.image.layer.index=0
  image.layer.download@
image.layer crisp.image.layer.index=1
  image.layer.download@
image.manifest
image.resolve@
`, "@", at)
}

// TestTraceMirrorFallback: each endpoint tried is its own image.resolve, the dead
// mirror's with the error; the caller's span gets an event saying the pull moved on.
func TestTraceMirrorFallback(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	reg := imagetest.StartRegistry(t)
	imagetest.Push(t, reg, "team/app:v1", img)
	root := t.TempDir()
	imagetest.WriteHosts(t, root, reg, fmt.Sprintf(`
server = "http://%s"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, reg, imagetest.ClosedAddr(t)))
	p, _ := newPuller(t, Config{HostsDir: root})
	tr := tracingtest.NewTracer(t)
	ctx, span := tr.Root("kubelet")
	if _, err := p.Pull(ctx, reg+"/team/app:v1", nil); err != nil {
		t.Fatal(err)
	}
	span.End()
	want := pulledTree(" crisp.image.mirror=false") + "image.resolve crisp.image.mirror=true ERROR\n"
	if got := tr.Tree(span, tracingtest.Sorted(), tracingtest.Keys(attrLayerIndex, attrMirror)); got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
	self, _ := tr.Self(span)
	if ev := self.Events(); len(ev) != 1 || ev[0].Name != "endpoint failed, trying the next" {
		t.Errorf("events of the caller's span: %v", ev)
	}
	for _, s := range tr.Spans(span) {
		if s.Name() == spanResolve {
			host := tracingtest.Attr(s, attrServerAddress)
			port := tracingtest.Attr(s, attrServerPort)
			if host != "127.0.0.1" || port == "" {
				t.Errorf("image.resolve at %s port %s", host, port)
			}
		}
	}
}

// TestTraceResolveTag: with a pull-only mirror the tag is resolved on its own
// (image.resolve.tag) by the upstream, and the pull then reads the mirror.
func TestTraceResolveTag(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	upstream := imagetest.StartRegistry(t)
	mirror := imagetest.StartRegistry(t)
	imagetest.Push(t, upstream, "team/app:v1", img)
	d := imagetest.Push(t, mirror, "team/app:v1", img)
	root := t.TempDir()
	imagetest.WriteHosts(t, root, upstream, fmt.Sprintf(`
server = "http://%s"

[host."http://%s"]
  capabilities = ["pull"]
`, upstream, mirror))
	p, _ := newPuller(t, Config{HostsDir: root})
	tr := tracingtest.NewTracer(t)
	ctx, span := tr.Root("kubelet")
	if _, err := p.Pull(ctx, upstream+"/team/app:v1", nil); err != nil {
		t.Fatal(err)
	}
	span.End()
	want := pulledTree(" crisp.image.mirror=true") + "image.resolve.tag crisp.image.mirror=false\n"
	if got := tr.Tree(span, tracingtest.Sorted(), tracingtest.Keys(attrLayerIndex, attrMirror)); got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
	for _, s := range tr.Spans(span) {
		if s.Name() == spanResolveTag {
			if got := tracingtest.Attr(s, attrDigest); got != d.String() {
				t.Errorf("image.resolve.tag digest %s, want %s", got, d)
			}
		}
	}
}

// TestTraceSignaturePolicy: the policy check is image.verify, which says whether the
// image was admitted; a refusal is its error, and nothing is fetched after it.
func TestTraceSignaturePolicy(t *testing.T) {
	reg := imagetest.StartRegistry(t)
	imagetest.Push(t, reg, "open/app:v1", imagetest.BuildImage(t, twoLayerEntries()...))
	imagetest.Push(t, reg, "closed/app:v1", imagetest.BuildImage(t, twoLayerEntries()...))
	pol, err := sigpolicy.Parse([]byte(fmt.Sprintf(`{"default": [{"type": "reject"}],
  "transports": {"docker": {%q: [{"type": "insecureAcceptAnything"}]}}}`, reg+"/open")), "policy.json")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := newPuller(t, Config{Policy: pol})
	tr := tracingtest.NewTracer(t)

	ctx, span := tr.Root("refused")
	if _, err := p.Pull(ctx, reg+"/closed/app:v1", nil); err == nil {
		t.Fatal("a pull the policy rejects succeeded")
	}
	span.End()
	want := `image.resolve
image.verify crisp.image.policy.admitted=false ERROR
`
	if got := tr.Tree(span, tracingtest.Sorted(), tracingtest.Keys(attrAdmitted)); got != want {
		t.Errorf("span tree of a refused pull:\n%s\nwant:\n%s", got, want)
	}
	for _, s := range tr.Spans(span) {
		if s.Name() == spanVerify {
			if req := tracingtest.Attr(s, attrRequirement); !strings.Contains(req, "reject") {
				t.Errorf("image.verify requirement %q", req)
			}
			if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, "reject") {
				t.Errorf("image.verify status %v", s.Status())
			}
		}
	}

	ctx, span = tr.Root("admitted")
	if _, err := p.Pull(ctx, reg+"/open/app:v1", nil); err != nil {
		t.Fatal(err)
	}
	span.End()
	want = pulledTree("") + "image.verify crisp.image.policy.admitted=true\n"
	if got := tr.Tree(span, tracingtest.Sorted(), tracingtest.Keys(attrLayerIndex, attrAdmitted)); got != want {
		t.Errorf("span tree of an admitted pull:\n%s\nwant:\n%s", got, want)
	}
}

// TestTraceSharedDownload: a pull that joins another's download of a blob records the
// wait (image.pull.wait) in its own trace; the download is in the other's only.
func TestTraceSharedDownload(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	layers := imagetest.LayerDigests(t, img)
	stall := imagetest.NewStaller()
	t.Cleanup(stall.Release)
	reg := imagetest.StartRegistry(t, imagetest.WithStalledBlobs(imagetest.Blobs(layers...), 16, stall))
	imagetest.Push(t, reg, "team/app:v1", img)
	p, _ := newPuller(t, Config{})
	tr := tracingtest.NewTracer(t)

	rootA, rootB := imagetest.PullTwice(t, tr, stall, len(layers), spanWait, func(ctx context.Context) error {
		_, err := p.Pull(ctx, reg+"/team/app:v1", nil)
		return err
	})
	if got, want := tr.Tree(rootA, tracingtest.Sorted(), tracingtest.Keys(attrLayerIndex)), pulledTree(""); got != want {
		t.Errorf("span tree of the pull that downloaded:\n%s\nwant:\n%s", got, want)
	}
	want := `image.config
image.layer crisp.image.layer.index=0
  image.pull.wait crisp.image.wait.for=download
image.layer crisp.image.layer.index=1
  image.pull.wait crisp.image.wait.for=download
image.manifest
image.resolve
`
	if got := tr.Tree(rootB, tracingtest.Sorted(), tracingtest.Keys(attrLayerIndex, attrWaitFor)); got != want {
		t.Errorf("span tree of the pull that waited:\n%s\nwant:\n%s", got, want)
	}
}
