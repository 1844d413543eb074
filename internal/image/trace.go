package image

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/crisp-runtime/crisp/internal/tracing"
)

// Span names of the image store. A pull's resolve, verify, manifest, config, layer
// and download spans are package remote's; the unpack and commit of each layer,
// under remote's image.layer, are this package's.
const (
	spanPull   = "image.pull"
	spanUnpack = "image.layer.unpack"
	spanCommit = "image.layer.commit"
	spanSync   = "image.sync"
	spanRecord = "image.record"
	spanRemove = "image.remove"
	spanGC     = "image.gc"
)

// Attribute keys: OpenTelemetry's semantic conventions where they have one
// (container.image.id, oci.manifest.digest), else crisp's own, named as package
// remote names the same things.
const (
	attrRef            = attribute.Key("crisp.image.ref")
	attrImageID        = attribute.Key("container.image.id")
	attrManifestDigest = attribute.Key("oci.manifest.digest")
	attrIndexDigest    = attribute.Key("crisp.image.index.digest")
	attrRepoDigest     = attribute.Key("crisp.image.repo_digest")
	attrSize           = attribute.Key("crisp.image.size")
	attrDownloaded     = attribute.Key("crisp.image.downloaded_bytes")
	attrLayers         = attribute.Key("crisp.image.layers")
	attrLayerDigest    = attribute.Key("crisp.image.layer.digest")
	attrChainID        = attribute.Key("crisp.image.layer.chain_id")
	attrParent         = attribute.Key("crisp.image.layer.parent")
	attrStreamed       = attribute.Key("crisp.image.layer.streamed")
	attrSnapshotExists = attribute.Key("crisp.image.layer.snapshot_exists")
	attrRefs           = attribute.Key("crisp.image.refs")
	attrFreedBlobs     = attribute.Key("crisp.image.gc.blobs")
	attrFreedSnapshots = attribute.Key("crisp.image.gc.snapshots")
)

// setImageAttrs records what a pull resolved to and what it cost.
func setImageAttrs(span trace.Span, img *Image, downloaded int64) {
	span.SetAttributes(attrImageID.String(img.ID), attrManifestDigest.String(img.ManifestDigest.String()),
		attrSize.Int64(img.Size), attrDownloaded.Int64(downloaded), attrLayers.Int(len(img.Layers)))
	if img.IndexDigest != "" {
		span.SetAttributes(attrIndexDigest.String(img.IndexDigest.String()))
	}
	if len(img.RepoDigests) > 0 {
		span.SetAttributes(attrRepoDigest.String(img.RepoDigest("")))
	}
}

// sync flushes the blobs and layers a pull stored: span image.sync (a syncfs may wait
// for everything the node wrote).
func (s *Service) sync(ctx context.Context) (err error) {
	_, span := tracing.Start(ctx, spanSync)
	defer tracing.Finish(span, &err)
	if err := s.content.Sync(); err != nil {
		return err
	}
	return s.snaps.Sync()
}

// recordTraced is record in span image.record.
func (s *Service) recordTraced(ctx context.Context, img *Image, refs []string) (*Image, error) {
	_, span := tracing.Start(ctx, spanRecord)
	if span.IsRecording() {
		span.SetAttributes(attrImageID.String(img.ID), attrRefs.Int(len(refs)))
	}
	out, err := s.record(img, refs)
	tracing.End(span, err)
	return out, err
}

// gcTraced is gcLocked in span image.gc, which counts what it freed.
func (s *Service) gcTraced(ctx context.Context) error {
	ctx, span := tracing.Start(ctx, spanGC)
	freed, err := s.gcLocked(ctx)
	if span.IsRecording() {
		span.SetAttributes(attrFreedBlobs.Int(freed.blobs), attrFreedSnapshots.Int(freed.snapshots))
	}
	tracing.End(span, err)
	return err
}
