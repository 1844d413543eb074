// Package spec maps a CRI container config, its pod's config and its image's config to an
// OCI runtime spec, the way kubelet expects and containerd does it (see README's semantics).
// It must not talk to shims, mount anything or touch the store: it only reads host facts.
package spec
