package image

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/image/remote"
)

// testModule is a WebAssembly core module whose _start traps: small enough for
// fixture.tree to show its content.
var testModule = string([]byte{
	0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00,
	0x01, 0x04, 0x01, 0x60, 0x00, 0x00,
	0x03, 0x02, 0x01, 0x00,
	0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00,
	0x0a, 0x05, 0x01, 0x03, 0x00, 0x00, 0x0b,
})

// wasmLayer is one layer of a wasm artifact pushed by pushWasm.
type wasmLayer struct {
	body      string
	title     string // org.opencontainers.image.title; none when empty
	mediaType string // remote.MediaTypeWasmLayer when empty
}

// rawManifest is a manifest pushed as it is.
type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.b, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// pushWasm pushes a wasm artifact as runwasi's oci-tar-builder writes one (a config
// of media type application/vnd.wasm.config.v0+json with os, architecture and
// layerDigests; one raw module per layer) to host as ref and returns its config
// digest. edit may change the config before it is pushed.
func pushWasm(t *testing.T, host, ref string, layers []wasmLayer, edit func(*remote.WasmConfig)) digest.Digest {
	t.Helper()
	r, err := name.ParseReference(host+"/"+ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	upload := func(b []byte, mt types.MediaType) ocispec.Descriptor {
		l := static.NewLayer(b, mt)
		if err := ggcrremote.WriteLayer(r.Context(), l); err != nil {
			t.Fatalf("push blob: %v", err)
		}
		d, _ := l.Digest()
		return ocispec.Descriptor{MediaType: string(mt), Digest: digest.Digest(d.String()), Size: int64(len(b))}
	}
	cfg := remote.WasmConfig{Created: "2024-01-01T00:00:00Z", Author: "crisp test", Architecture: "wasm", OS: "wasip1"}
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest}
	m.SchemaVersion = 2
	for _, l := range layers {
		mt := l.mediaType
		if mt == "" {
			mt = remote.MediaTypeWasmLayer
		}
		d := upload([]byte(l.body), types.MediaType(mt))
		if l.title != "" {
			d.Annotations = map[string]string{ocispec.AnnotationTitle: l.title}
		}
		m.Layers = append(m.Layers, d)
		cfg.LayerDigests = append(cfg.LayerDigests, d.Digest)
	}
	if edit != nil {
		edit(&cfg)
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Config = upload(cb, remote.MediaTypeWasmConfig)
	mb, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := ggcrremote.Put(r, rawManifest{b: mb, mt: types.OCIManifestSchema1}); err != nil {
		t.Fatalf("push manifest: %v", err)
	}
	return m.Config.Digest
}

func TestPullWasmArtifact(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	other := testModule + "\x00" // another module, so another blob
	id := pushWasm(t, host, "wasm/hello:v1", []wasmLayer{
		{body: testModule, title: "hello.wasm"},
		{body: other},
	}, nil)
	img, err := f.svc.Pull(context.Background(), host+"/wasm/hello:v1", nil)
	if err != nil {
		t.Fatalf("pull a wasm artifact: %v", err)
	}
	if img.ID != id.String() {
		t.Errorf("image ID %s, want the artifact's config digest %s", img.ID, id)
	}
	spec, err := img.Spec()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(spec.Config.Entrypoint, []string{"/hello.wasm"}) || spec.OS != "wasip1" || spec.Architecture != "wasm" || spec.Author != "crisp test" {
		t.Errorf("config %+v: want entrypoint [/hello.wasm], wasip1/wasm, the author", spec)
	}
	if spec.Created == nil || spec.Created.Year() != 2024 {
		t.Errorf("created %v, want the artifact's", spec.Created)
	}
	want := map[string]string{"hello.wasm": testModule, "module.wasm": other}
	if got := f.tree(img); !mapsEqual(got, want) {
		t.Errorf("rootfs %q, want %q", got, want)
	}
	// Reported like any image, and found again after a restart.
	f.open()
	list := f.svc.List()
	if len(list) != 1 || list[0].ID != img.ID || !slices.Contains(list[0].RepoTags, host+"/wasm/hello:v1") {
		t.Fatalf("List after a restart = %+v", list)
	}
	if got := f.tree(list[0]); !mapsEqual(got, want) {
		t.Errorf("rootfs after a restart %q, want %q", got, want)
	}
	// A second artifact of the same module shares its layer's snapshot.
	pushWasm(t, host, "wasm/again:v1", []wasmLayer{{body: testModule, title: "hello.wasm"}}, func(c *remote.WasmConfig) { c.Author = "again" })
	again, err := f.svc.Pull(context.Background(), host+"/wasm/again:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.ChainIDs[0] != img.ChainIDs[0] {
		t.Errorf("the same module layer has chain IDs %s and %s", again.ChainIDs[0], img.ChainIDs[0])
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestPullWasmArtifactRefused(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	script := "#!/bin/sh\necho not wasm\n"
	for _, tc := range []struct {
		name   string
		layers []wasmLayer
		edit   func(*remote.WasmConfig)
		is     func(error) bool
		want   []string
	}{
		{
			name:   "not wasm",
			layers: []wasmLayer{{body: testModule, title: "ok.wasm"}, {body: script, title: "script"}},
			is:     errdefs.IsInvalidArgument,
			want:   []string{digest.FromString(script).String(), "is not a WebAssembly module", "23 21 2f 62"},
		},
		{
			name:   "empty layer",
			layers: []wasmLayer{{body: ""}},
			is:     errdefs.IsInvalidArgument,
			want:   []string{digest.FromString("").String(), "is empty, not a WebAssembly module"},
		},
		{
			name:   "tar layer",
			layers: []wasmLayer{{body: testModule, mediaType: ocispec.MediaTypeImageLayer}},
			is:     errdefs.IsNotImplemented,
			want:   []string{digest.FromString(testModule).String(), ocispec.MediaTypeImageLayer},
		},
		{
			name:   "layer digests",
			layers: []wasmLayer{{body: testModule}},
			edit:   func(c *remote.WasmConfig) { c.LayerDigests = []digest.Digest{digest.FromString("other")} },
			is:     errdefs.IsInvalidArgument,
			want:   []string{"layerDigests"},
		},
		{
			name:   "same name",
			layers: []wasmLayer{{body: testModule, title: "a.wasm"}, {body: testModule + "x", title: "dir/a"}},
			is:     errdefs.IsInvalidArgument,
			want:   []string{`both named "a.wasm"`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := host + "/wasm/" + strings.ReplaceAll(tc.name, " ", "-") + ":v1"
			pushWasm(t, host, strings.TrimPrefix(ref, host+"/"), tc.layers, tc.edit)
			_, err := f.svc.Pull(context.Background(), ref, nil)
			if err == nil || !tc.is(err) {
				t.Fatalf("pull = %v; want an error of the right kind", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			t.Logf("%v", err)
			if _, err := f.svc.Get(ref); !errdefs.IsNotFound(err) {
				t.Errorf("Get after a refused pull: %v, want NotFound", err)
			}
		})
	}
	// Nothing of the refused pulls is left: no snapshot, no blob.
	if infos, err := f.svc.snaps.List(); err != nil || len(infos) != 0 {
		t.Errorf("snapshots after refused pulls: %v, %v", infos, err)
	}
}

// TestPullImageWithWasm pulls an ordinary image whose layers carry a .wasm file that
// its entrypoint names, as crun's and runwasi's compat variant runs: nothing is
// special about it.
func TestPullImageWithWasm(t *testing.T) {
	f := newFixture(t)
	host := imagetest.StartRegistry(t)
	img := imagetest.NewImage(t, imagetest.ImageOptions{
		Config:      v1.Config{Entrypoint: []string{"/app/hello.wasm"}, Env: []string{"GREETING=hi"}},
		Annotations: map[string]string{"module.wasm.image/variant": "compat"},
	},
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.Dir("app"), imagetest.File("app/README", "read me")),
		imagetest.NewLayer(t, imagetest.OCI, imagetest.Zstd, imagetest.File("app/hello.wasm", testModule)),
	)
	imagetest.Push(t, host, "compat:v1", img)
	got, err := f.svc.Pull(context.Background(), host+"/compat:v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := got.Spec()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(spec.Config.Entrypoint, []string{"/app/hello.wasm"}) || len(got.Layers) != 2 {
		t.Errorf("entrypoint %q, %d layers", spec.Config.Entrypoint, len(got.Layers))
	}
	want := map[string]string{"app": "dir", "app/README": "read me", "app/hello.wasm": testModule}
	if tree := f.tree(got); !mapsEqual(tree, want) {
		t.Errorf("rootfs %q, want %q", tree, want)
	}
}
