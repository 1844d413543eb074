package image

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	digest "github.com/opencontainers/go-digest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/image/remote"
	"github.com/crisp-runtime/crisp/internal/tracing/tracingtest"
)

// Attributes the tree renderings show (remote's keys, spelled out: they are its own).
const (
	keyLayerIndex = attribute.Key("crisp.image.layer.index")
	keyWaitFor    = attribute.Key("crisp.image.wait.for")
	keyBlobDigest = attribute.Key("crisp.image.blob.digest")
	keyBytesRead  = attribute.Key("crisp.image.download.bytes")
	keyAdmitted   = attribute.Key("crisp.image.policy.admitted")
)

// twoLayers builds a two-layer image (gzip and uncompressed layers of 64 KiB each).
func twoLayers(t *testing.T) (v1.Image, []digest.Digest) {
	t.Helper()
	l0 := imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.Dir("etc"), imagetest.RandomFile("etc/a", 64<<10, 1))
	l1 := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("etc/b", 64<<10, 2))
	return imagetest.NewImage(t, imagetest.ImageOptions{}, l0, l1), []digest.Digest{imagetest.Digest(t, l0), imagetest.Digest(t, l1)}
}

// fullPull is the tree of a pull that downloads, unpacks and commits both layers.
const fullPull = `image.pull
  image.config
    image.blob.download
  image.layer crisp.image.layer.index=0
    image.layer.commit
    image.layer.download
    image.layer.unpack
  image.layer crisp.image.layer.index=1
    image.layer.commit
    image.layer.download
    image.layer.unpack
  image.manifest
  image.record
  image.resolve
  image.sync
`

// TestTracePull: a pull of a two-layer image is image.pull with the phases under it,
// each layer's download, unpack and commit under its image.layer, each naming the
// layer; the pull's span says what it resolved to and what it downloaded.
func TestTracePull(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	pushed, layers := twoLayers(t)
	imagetest.Push(t, host, "traced:v1", pushed)
	id := imagetest.ConfigDigest(t, pushed).String()
	tr := tracingtest.NewTracer(t)
	ctx, root := tr.Root("kubelet")
	img, err := f.svc.Pull(ctx, host+"/traced:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	root.End()
	if got := tr.Tree(root, tracingtest.Sorted(), tracingtest.Keys(keyLayerIndex)); got != fullPull {
		t.Fatalf("span tree:\n%s\nwant:\n%s", got, fullPull)
	}
	spans := tr.Spans(root)
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID().String()] = s
	}
	for _, s := range spans {
		switch s.Name() {
		case spanPull:
			for k, want := range map[attribute.Key]string{
				attrRef: host + "/traced:v1", attrImageID: id, attrManifestDigest: img.ManifestDigest.String(), attrLayers: "2",
			} {
				if got := tracingtest.Attr(s, k); got != want {
					t.Errorf("image.pull %s = %q, want %q", k, got, want)
				}
			}
			if got := tracingtest.Attr(s, attrDownloaded); got == "0" || got == "" {
				t.Errorf("image.pull downloaded %q bytes", got)
			}
		case "image.layer.download", spanUnpack, spanCommit:
			// Each names the layer of the image.layer it is under.
			parent := byID[s.Parent().SpanID().String()]
			i := tracingtest.Attr(parent, keyLayerIndex)
			want := layers[map[string]int{"0": 0, "1": 1}[i]].String()
			key := attrLayerDigest
			if s.Name() == "image.layer.download" {
				key = keyBlobDigest
			}
			if got := tracingtest.Attr(s, key); got != want {
				t.Errorf("%s under layer %s: %s = %q, want %q", s.Name(), i, key, got, want)
			}
			if s.Name() == "image.layer.download" {
				size := tracingtest.Attr(parent, "crisp.image.layer.size")
				if got := tracingtest.Attr(s, keyBytesRead); got != size || size == "" {
					t.Errorf("download of layer %s read %s bytes, the layer has %s", i, got, size)
				}
			}
			if s.Name() == spanUnpack {
				if got := tracingtest.Attr(s, attrStreamed); got != "true" {
					t.Errorf("unpack of layer %s: streamed = %q", i, got)
				}
			}
		}
	}

	// Pulled again: the layers' snapshots are there, nothing downloads.
	ctx, root = tr.Root("again")
	if _, err := f.svc.Pull(ctx, host+"/traced:v1", nil); err != nil {
		t.Fatal(err)
	}
	root.End()
	want := `image.pull
  image.config
  image.layer crisp.image.layer.index=0 crisp.image.layer.snapshot_exists=true
  image.layer crisp.image.layer.index=1 crisp.image.layer.snapshot_exists=true
  image.manifest
  image.record
  image.resolve
  image.sync
`
	if got := tr.Tree(root, tracingtest.Sorted(), tracingtest.Keys(keyLayerIndex, attrSnapshotExists)); got != want {
		t.Errorf("span tree of a pull of a stored image:\n%s\nwant:\n%s", got, want)
	}

	// Removed: image.remove frees both layers' blobs and snapshots, the manifest and
	// the config.
	ctx, root = tr.Root("gc")
	if err := f.svc.Remove(ctx, img.ID); err != nil {
		t.Fatal(err)
	}
	root.End()
	want = `image.remove
  image.gc crisp.image.gc.blobs=4 crisp.image.gc.snapshots=2
`
	if got := tr.Tree(root, tracingtest.Sorted(), tracingtest.Keys(attrFreedBlobs, attrFreedSnapshots)); got != want {
		t.Errorf("span tree of a removal:\n%s\nwant:\n%s", got, want)
	}
}

// TestTraceSharedPull: a pull that finds another one pulling the same layers waits
// for them in spans of its own trace (image.pull.wait), while the download, unpack
// and commit are in the trace of the pull doing them: no span is lost or in both.
func TestTraceSharedPull(t *testing.T) {
	f := newFixture(t)
	img, layers := twoLayers(t)
	stall := imagetest.NewStaller()
	host := imagetest.StartRegistry(t, imagetest.WithStalledBlobs(imagetest.Blobs(layers...), 1024, stall))
	imagetest.Push(t, host, "shared:v1", img)
	t.Cleanup(stall.Release)
	tr := tracingtest.NewTracer(t)

	rootA, rootB := imagetest.PullTwice(t, tr, stall, len(layers), "image.pull.wait", func(ctx context.Context) error {
		_, err := f.svc.Pull(ctx, host+"/shared:v1", nil)
		return err
	})
	if got := tr.Tree(rootA, tracingtest.Sorted(), tracingtest.Keys(keyLayerIndex)); got != fullPull {
		t.Errorf("span tree of the pull that downloaded:\n%s\nwant:\n%s", got, fullPull)
	}
	want := `image.pull
  image.config
  image.layer crisp.image.layer.index=0 crisp.image.layer.snapshot_exists=true
    image.pull.wait crisp.image.wait.for=unpack
  image.layer crisp.image.layer.index=1 crisp.image.layer.snapshot_exists=true
    image.pull.wait crisp.image.wait.for=unpack
  image.manifest
  image.record
  image.resolve
  image.sync
`
	if got := tr.Tree(rootB, tracingtest.Sorted(), tracingtest.Keys(keyLayerIndex, attrSnapshotExists, keyWaitFor)); got != want {
		t.Errorf("span tree of the pull that waited:\n%s\nwant:\n%s", got, want)
	}
}

// TestTraceStalledPull: a registry that stops sending fails the layer's download,
// the layer and the pull, each with the stall as its status; what the pull stored is
// freed under it (image.gc).
func TestTraceStalledPull(t *testing.T) {
	f := newFixture(t)
	svc, err := New(Config{Root: filepath.Join(f.root, "stalled"), Remote: remote.Config{ProgressTimeout: 300 * time.Millisecond}}, f.db, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	layer := imagetest.NewLayer(t, imagetest.OCI, imagetest.Uncompressed, imagetest.RandomFile("big", 256<<10, 3))
	img := imagetest.NewImage(t, imagetest.ImageOptions{}, layer)
	stall := imagetest.NewStaller()
	t.Cleanup(stall.Release)
	host := imagetest.StartRegistry(t, imagetest.WithStalledBlobs(imagetest.Blobs(imagetest.Digest(t, layer)), 1000, stall))
	imagetest.Push(t, host, "stalled:v1", img)
	tr := tracingtest.NewTracer(t)
	ctx, root := tr.Root("kubelet")
	if _, err := svc.Pull(ctx, host+"/stalled:v1", nil); err == nil {
		t.Fatal("a stalled pull succeeded")
	}
	root.End()
	want := `image.pull ERROR
  image.config
    image.blob.download
  image.gc
  image.layer ERROR
    image.layer.download ERROR
    image.layer.unpack ERROR
  image.manifest
  image.resolve
`
	if got := tr.Tree(root, tracingtest.Sorted()); got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
	for _, s := range tr.Spans(root) {
		if s.Status().Code == codes.Error && !strings.Contains(s.Status().Description, "sent no data") {
			t.Errorf("%s: status %q does not name the stall", s.Name(), s.Status().Description)
		}
	}
}

// TestTraceUntracedPull: without a span in the context a pull works and records
// nothing.
func TestTraceUntracedPull(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	img, _ := twoLayers(t)
	imagetest.Push(t, host, "untraced:v1", img)
	tr := tracingtest.NewTracer(t)
	_, root := tr.Root("unrelated")
	if _, err := f.svc.Pull(context.Background(), host+"/untraced:v1", nil); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Remove(context.Background(), host+"/untraced:v1"); err != nil {
		t.Fatal(err)
	}
	root.End()
	if n := tr.Started(root, "image.pull") + len(tr.Spans(root)); n != 0 {
		t.Errorf("an untraced pull recorded %d spans", n)
	}
}
