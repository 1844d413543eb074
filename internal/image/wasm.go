package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/crisp-runtime/crisp/internal/image/remote"
)

// wasmMagic starts every WebAssembly binary, core module or component.
var wasmMagic = []byte{0x00, 'a', 's', 'm'}

// wasmLayerTar returns the tar stream a wasm artifact's module layer unpacks as: one
// file, l.Path at the root, mode 0644, owned by root, of the blob's l.Size bytes read
// from r. So the module goes through the same unpack as any layer (the free-space
// reserve, the cap on unverified bytes, the snapshot's commit), and no second way of
// writing a snapshot exists. A blob that does not start with the WebAssembly magic is
// refused before anything is written, with an error wrapping
// errdefs.ErrInvalidArgument naming the layer.
func wasmLayerTar(r io.Reader, l remote.Layer) (io.ReadCloser, error) {
	head := make([]byte, len(wasmMagic))
	n, err := io.ReadFull(r, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read module: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("wasm artifact layer (%s) is empty, not a WebAssembly module: %w", remote.MediaTypeWasmLayer, errdefs.ErrInvalidArgument)
	}
	if !bytes.Equal(head[:n], wasmMagic) {
		return nil, fmt.Errorf("wasm artifact layer (%s) is not a WebAssembly module: it starts with % x, not \\0asm: %w",
			remote.MediaTypeWasmLayer, head[:n], errdefs.ErrInvalidArgument)
	}
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: l.Path, Size: l.Size, Mode: 0o644,
			ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		err := tw.WriteHeader(hdr)
		if err == nil {
			_, err = io.Copy(tw, io.MultiReader(bytes.NewReader(head), r))
		}
		if err == nil {
			// Close fails when the blob was shorter than its declared size.
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// wasmImageConfig turns a wasm artifact's config into the OCI image config the CRI
// reads: its created, author, os and architecture (wasip1 and wasm when it names
// none), the first module as the entrypoint, and the layers' diff IDs.
func wasmImageConfig(cb []byte, layers []remote.Layer) ([]byte, error) {
	var wc remote.WasmConfig
	if err := json.Unmarshal(cb, &wc); err != nil {
		return nil, fmt.Errorf("wasm config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	img := ocispec.Image{
		Author:   wc.Author,
		Platform: ocispec.Platform{OS: wc.OS, Architecture: wc.Architecture},
		Config:   ocispec.ImageConfig{Entrypoint: []string{"/" + layers[0].Path}},
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	if img.OS == "" {
		img.OS = "wasip1"
	}
	if img.Architecture == "" {
		img.Architecture = "wasm"
	}
	if t, err := time.Parse(time.RFC3339Nano, wc.Created); err == nil {
		img.Created = &t
	}
	for _, l := range layers {
		img.RootFS.DiffIDs = append(img.RootFS.DiffIDs, l.DiffID)
	}
	b, err := json.Marshal(img)
	if err != nil {
		return nil, fmt.Errorf("encode the image config of a wasm artifact: %w", err)
	}
	return b, nil
}

// isWasmLayer reports whether l is a wasm artifact's module layer.
func isWasmLayer(l remote.Layer) bool { return l.MediaType == remote.MediaTypeWasmLayer }
