package remote

import (
	"net"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Span names of a pull's phases in this package; the pull's own span (image.pull)
// and the unpack and commit of each layer are the image package's.
const (
	spanResolveTag   = "image.resolve.tag"
	spanResolve      = "image.resolve"
	spanVerify       = "image.verify"
	spanManifest     = "image.manifest"
	spanConfig       = "image.config"
	spanLayer        = "image.layer"
	spanLayerFetch   = "image.layer.download"
	spanBlobFetch    = "image.blob.download"
	spanWait         = "image.pull.wait"
	attrWaitDownload = "download"
)

// Attribute keys: OpenTelemetry's semantic conventions where they have one
// (server.*, oci.manifest.digest, container.image.id), else crisp's own.
const (
	attrServerAddress  = attribute.Key("server.address")
	attrServerPort     = attribute.Key("server.port")
	attrMirror         = attribute.Key("crisp.image.mirror")
	attrRef            = attribute.Key("crisp.image.ref")
	attrDigest         = attribute.Key("crisp.image.digest")
	attrMediaType      = attribute.Key("crisp.image.media_type")
	attrManifestDigest = attribute.Key("oci.manifest.digest")
	attrIndexDigest    = attribute.Key("crisp.image.index.digest")
	attrPlatform       = attribute.Key("crisp.image.platform")
	attrImageID        = attribute.Key("container.image.id")
	attrLayers         = attribute.Key("crisp.image.layers")
	attrRequirement    = attribute.Key("crisp.image.policy.requirement")
	attrAdmitted       = attribute.Key("crisp.image.policy.admitted")
	attrBlobDigest     = attribute.Key("crisp.image.blob.digest")
	attrBlobSize       = attribute.Key("crisp.image.blob.size")
	attrBytesRead      = attribute.Key("crisp.image.download.bytes")
	attrWaitFor        = attribute.Key("crisp.image.wait.for")
	attrLayerIndex     = attribute.Key("crisp.image.layer.index")
	attrLayerDigest    = attribute.Key("crisp.image.layer.digest")
	attrLayerSize      = attribute.Key("crisp.image.layer.size")
	attrLayerMediaType = attribute.Key("crisp.image.layer.media_type")
	attrLayerDiffID    = attribute.Key("crisp.image.layer.diff_id")
	attrError          = attribute.Key("error.message")
)

// Attributes describes the layer on a span: its digest, size, media type and diff ID.
// It allocates: call it for a recording span only.
func (l Layer) Attributes() []attribute.KeyValue {
	return []attribute.KeyValue{attrLayerDigest.String(l.Digest.String()), attrLayerSize.Int64(l.Size),
		attrLayerMediaType.String(l.MediaType), attrLayerDiffID.String(l.DiffID.String())}
}

// setEndpoint names the endpoint a span's requests go to, as server.address and
// server.port, and whether it is a mirror.
func setEndpoint(span trace.Span, ep endpoint) {
	host, port, err := net.SplitHostPort(ep.host)
	if err != nil {
		span.SetAttributes(attrServerAddress.String(ep.host), attrMirror.Bool(ep.mirror))
		return
	}
	span.SetAttributes(attrServerAddress.String(host), attrMirror.Bool(ep.mirror))
	if n, err := strconv.Atoi(port); err == nil {
		span.SetAttributes(attrServerPort.Int(n))
	}
}
