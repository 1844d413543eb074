// Package imagetest helps tests that need images: it starts an in-process OCI
// registry on 127.0.0.1 (go-containerregistry's pkg/registry) with optional faults
// (basic auth, tampered, truncated, dying or stalled blobs, error statuses) and
// request counting, builds layers from in-memory tar entries (files, directories,
// symlinks, hard links, whiteouts, opaque directories; gzip, zstd or uncompressed;
// OCI or Docker media types), images and multi-platform indexes, a busybox image from
// Debian's busybox-static, and pushes them; and it runs two pulls at once, the second
// finding the first's downloads under way (PullTwice), for the tracing tests.
//
// It is an ordinary package so that any package's tests can import it; production
// code must not.
package imagetest
