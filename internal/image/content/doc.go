// Package content is crisp's content-addressed blob store: it owns manifests, configs
// and compressed layers by digest under root/blobs/<algorithm>/<hex>, verifies every
// blob against its digest and size while it is written, and makes a blob visible only
// once it is complete and synced. It does not parse what it stores: manifests and
// configs are the concern of image/remote and image.
package content
