package remote

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Media types of the CNCF WebAssembly OCI artifact (tag-runtime's wasm OCI artifact
// layout, what runwasi's oci-tar-builder and wasm-pkg-tools push): a config of its
// own and layers that are each a raw module, not a tar.
const (
	MediaTypeWasmConfig = "application/vnd.wasm.config.v0+json"
	MediaTypeWasmLayer  = "application/vnd.wasm.content.layer.v1+wasm"
)

// wasmDefaultName is a module layer's file name when its title annotation gives
// none.
const wasmDefaultName = "module.wasm"

// WasmConfig is the config blob of a wasm artifact.
type WasmConfig struct {
	Created      string          `json:"created,omitempty"`
	Author       string          `json:"author,omitempty"`
	Architecture string          `json:"architecture,omitempty"`
	OS           string          `json:"os,omitempty"`
	LayerDigests []digest.Digest `json:"layerDigests,omitempty"`
	Component    json.RawMessage `json:"component,omitempty"`
}

// IsWasmArtifact reports whether a manifest's config media type is a wasm
// artifact's.
func IsWasmArtifact(configMediaType string) bool { return configMediaType == MediaTypeWasmConfig }

// checkWasmManifest refuses a wasm artifact whose layers are not modules, before
// anything is downloaded.
func checkWasmManifest(m *ocispec.Manifest) error {
	if len(m.Layers) == 0 {
		return fmt.Errorf("wasm artifact without a module layer: %w", errdefs.ErrInvalidArgument)
	}
	for _, l := range m.Layers {
		if l.MediaType != MediaTypeWasmLayer {
			return fmt.Errorf("wasm artifact layer %s has media type %q, not %s: %w", l.Digest, l.MediaType, MediaTypeWasmLayer, errdefs.ErrNotImplemented)
		}
	}
	return nil
}

// wasmLayers checks the wasm config cb of manifest m and returns its layers. Each
// becomes one file at the root of the image's filesystem, named by the layer's
// org.opencontainers.image.title annotation (its last element, with ".wasm" added when
// it lacks it), else module.wasm. A module layer has no tar and so no diff ID: its
// DiffID is a digest of the blob's digest and the file's name, which identifies the
// file the layer unpacks to, so that its snapshot is shared like any layer's.
func wasmLayers(m *ocispec.Manifest, cb []byte) ([]Layer, error) {
	var cfg WasmConfig
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return nil, fmt.Errorf("wasm config %s: not valid JSON: %w: %w", m.Config.Digest, err, errdefs.ErrInvalidArgument)
	}
	if len(cfg.LayerDigests) > 0 {
		want := make([]digest.Digest, len(m.Layers))
		for i, l := range m.Layers {
			want[i] = l.Digest
		}
		if !slices.Equal(cfg.LayerDigests, want) {
			return nil, fmt.Errorf("wasm config %s: layerDigests %v do not match the manifest's layers %v: %w", m.Config.Digest, cfg.LayerDigests, want, errdefs.ErrInvalidArgument)
		}
	}
	layers := make([]Layer, len(m.Layers))
	seen := map[string]digest.Digest{}
	for i, l := range m.Layers {
		name := WasmFileName(l.Annotations[ocispec.AnnotationTitle])
		if other, ok := seen[name]; ok {
			return nil, fmt.Errorf("wasm artifact layers %s and %s are both named %q: %w", other, l.Digest, name, errdefs.ErrInvalidArgument)
		}
		seen[name] = l.Digest
		sum := sha256.Sum256([]byte("crisp wasm layer v1\x00" + l.Digest.String() + "\x00" + name))
		layers[i] = Layer{Digest: l.Digest, Size: l.Size, MediaType: l.MediaType,
			DiffID: digest.NewDigestFromBytes(digest.SHA256, sum[:]), Path: name}
	}
	return layers, nil
}

// WasmFileName is the file a module layer titled title becomes, at the root of the
// image's filesystem: the title's last element, ".wasm" added when it lacks it, or
// module.wasm when the title is empty or names no file.
func WasmFileName(title string) string {
	name := path.Base(path.Clean("/" + strings.ReplaceAll(title, "\\", "/")))
	if name == "/" || name == "." || name == ".." || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return wasmDefaultName
	}
	if !strings.HasSuffix(name, ".wasm") {
		name += ".wasm"
	}
	return name
}
