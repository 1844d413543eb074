// Package snapshot owns the on-disk image layers (one overlay directory per chain ID) and the writable container rootfs snapshots on top of them, with their metadata.
// It unpacks untrusted, already decompressed layer tars safely (refusing path escapes) and atomically, so a failure or crash leaves nothing behind.
// It must not talk to registries, decompress or verify blobs, or know the CRI's types: callers hand it plain tar streams and chain IDs.
package snapshot
