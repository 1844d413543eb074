// Package image is crisp's image store: it pulls through image/remote into the content
// store, unpacks layers into image/snapshot, keeps image metadata and references in the
// bbolt store, and frees what no image references. It must not know the CRI's types.
package image
