// Package spec maps a CRI container config, its pod's config and its image's config to
// an OCI runtime spec, with the semantics kubelet expects and containerd implements.
// It must not talk to shims, mount anything or touch the store: it only reads the host.
package spec
