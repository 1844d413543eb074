// Package remote is crisp's registry client: it turns a user's image reference into
// its canonical name, resolves it (an index to the manifest for the node's platform),
// and downloads the manifest(s), the config and every layer blob into the content
// store, honouring mirrors, insecure registries and CRI credentials. It verifies and
// stores; it does not unpack layers and keeps no metadata of its own: what a pull
// produced is returned to the caller (package image) to record.
package remote
