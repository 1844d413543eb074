package imagetest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
)

// EntryType is the kind of a TarEntry.
type EntryType int

// Kinds of tar entries. Whiteout and Opaque are the OCI layer markers, written as the
// regular files ".wh.<name>" and "<dir>/.wh..wh..opq".
const (
	TypeFile EntryType = iota
	TypeDir
	TypeSymlink
	TypeHardlink
	TypeWhiteout
	TypeOpaque
)

// TarEntry is one entry of a layer. Name is a path inside the layer without a leading
// "/" (one is stripped if given). Mode 0 means the usual default for the type.
type TarEntry struct {
	Type EntryType
	// Name is the path of the entry; for TypeWhiteout the path being deleted, for
	// TypeOpaque the directory whose lower content is hidden.
	Name string
	Body []byte
	// Link is the target of a symlink (any string) or of a hard link (a path in the layer).
	Link     string
	Mode     int64
	UID, GID int
}

// File returns a regular file entry with mode 0644.
func File(name, body string) TarEntry {
	return TarEntry{Type: TypeFile, Name: name, Body: []byte(body)}
}

// Executable returns a regular file entry with mode 0755.
func Executable(name string, body []byte) TarEntry {
	return TarEntry{Type: TypeFile, Name: name, Body: body, Mode: 0o755}
}

// Dir returns a directory entry with mode 0755.
func Dir(name string) TarEntry { return TarEntry{Type: TypeDir, Name: name} }

// Symlink returns a symlink at name pointing to target.
func Symlink(name, target string) TarEntry {
	return TarEntry{Type: TypeSymlink, Name: name, Link: target}
}

// Hardlink returns a hard link at name to the earlier entry target.
func Hardlink(name, target string) TarEntry {
	return TarEntry{Type: TypeHardlink, Name: name, Link: target}
}

// Whiteout returns the marker that deletes name from the layers below.
func Whiteout(name string) TarEntry { return TarEntry{Type: TypeWhiteout, Name: name} }

// Opaque returns the marker that hides everything below in directory dir.
func Opaque(dir string) TarEntry { return TarEntry{Type: TypeOpaque, Name: dir} }

// RandomFile returns a file of size bytes of pseudo-random (incompressible) data,
// the same for the same seed.
func RandomFile(name string, size int, seed uint64) TarEntry {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	body := make([]byte, size)
	_, _ = rand.NewChaCha8(s).Read(body) // ChaCha8.Read always fills body and returns nil
	return TarEntry{Type: TypeFile, Name: name, Body: body}
}

// epoch is every entry's mtime, so that the same entries always make the same layer.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Tar returns the uncompressed tar stream of entries, in the order given.
func Tar(t testing.TB, entries ...TarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		name := strings.TrimPrefix(e.Name, "/")
		hdr := &tar.Header{Name: name, Mode: e.Mode, Uid: e.UID, Gid: e.GID, ModTime: epoch, Format: tar.FormatPAX}
		switch e.Type {
		case TypeFile:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(e.Body))
			if hdr.Mode == 0 {
				hdr.Mode = 0o644
			}
		case TypeDir:
			hdr.Typeflag = tar.TypeDir
			hdr.Name = strings.TrimSuffix(name, "/") + "/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
		case TypeSymlink:
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = e.Link
			if hdr.Mode == 0 {
				hdr.Mode = 0o777
			}
		case TypeHardlink:
			hdr.Typeflag = tar.TypeLink
			hdr.Linkname = strings.TrimPrefix(e.Link, "/")
		case TypeWhiteout:
			dir, base := path.Split(strings.TrimSuffix(name, "/"))
			hdr.Typeflag = tar.TypeReg
			hdr.Name = dir + ".wh." + base
			hdr.Mode = 0o644
		case TypeOpaque:
			hdr.Typeflag = tar.TypeReg
			hdr.Name = path.Join(name, ".wh..wh..opq")
			hdr.Mode = 0o644
		default:
			t.Fatalf("imagetest: unknown entry type %d for %q", e.Type, e.Name)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("imagetest: tar header %q: %v", e.Name, err)
		}
		if hdr.Typeflag == tar.TypeReg && len(e.Body) > 0 {
			if _, err := tw.Write(e.Body); err != nil {
				t.Fatalf("imagetest: tar body %q: %v", e.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Format selects OCI or Docker schema 2 media types.
type Format int

// Media type families.
const (
	OCI Format = iota
	Docker
)

// Compression is how a layer blob is compressed.
type Compression int

// Layer compressions.
const (
	Gzip Compression = iota
	Zstd
	Uncompressed
)

// DockerLayerZstd is the Docker-family media type of a zstd layer (containerd's
// name for it); go-containerregistry has no constant for it.
const DockerLayerZstd types.MediaType = "application/vnd.docker.image.rootfs.diff.tar.zstd"

// LayerMediaType returns the media type of a layer of format f compressed with c.
func LayerMediaType(f Format, c Compression) types.MediaType {
	switch {
	case f == Docker && c == Gzip:
		return types.DockerLayer
	case f == Docker && c == Zstd:
		return DockerLayerZstd
	case f == Docker:
		return types.DockerUncompressedLayer
	case c == Gzip:
		return types.OCILayer
	case c == Zstd:
		return types.OCILayerZStd
	default:
		return types.OCIUncompressedLayer
	}
}

// Layer is an in-memory layer whose bytes are fixed when it is made, so its digests
// are known without computing anything again. It implements v1.Layer.
type Layer struct {
	blob []byte
	tar  []byte
	// gen, when set, produces the tar stream again instead of tar (too big to keep).
	gen       func(w io.Writer) error
	digest    v1.Hash
	diffID    v1.Hash
	mediaType types.MediaType
}

var _ v1.Layer = (*Layer)(nil)

// NewLayer returns a layer holding entries, compressed with c, with f's media type.
func NewLayer(t testing.TB, f Format, c Compression, entries ...TarEntry) *Layer {
	t.Helper()
	return LayerFromTar(t, f, c, Tar(t, entries...))
}

// LayerFromTar returns a layer holding the tar stream tarball.
func LayerFromTar(t testing.TB, f Format, c Compression, tarball []byte) *Layer {
	t.Helper()
	var blob []byte
	switch c {
	case Gzip:
		var buf bytes.Buffer
		zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := zw.Write(tarball); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		blob = buf.Bytes()
	case Zstd:
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			t.Fatal(err)
		}
		blob = enc.EncodeAll(tarball, nil)
		enc.Close()
	default:
		blob = tarball
	}
	return &Layer{
		blob:      blob,
		tar:       tarball,
		digest:    sha256Hash(blob),
		diffID:    sha256Hash(tarball),
		mediaType: LayerMediaType(f, c),
	}
}

func sha256Hash(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// Digest returns the digest of the compressed blob.
func (l *Layer) Digest() (v1.Hash, error) { return l.digest, nil }

// DiffID returns the digest of the uncompressed tar.
func (l *Layer) DiffID() (v1.Hash, error) { return l.diffID, nil }

// Compressed returns the blob as stored in a registry.
func (l *Layer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}

// Uncompressed returns the tar stream.
func (l *Layer) Uncompressed() (io.ReadCloser, error) {
	if l.gen != nil {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(l.gen(pw)) }()
		return pr, nil
	}
	return io.NopCloser(bytes.NewReader(l.tar)), nil
}

// ZerosLayer returns a gzip layer holding the one file name of size zero bytes: a
// layer that unpacks to about a thousand times what it downloads (deflate's limit),
// like a small gzip of a huge sparse file, which tar extraction writes out in full.
// It is built as a stream, so only the compressed blob is kept in memory; TarBytes of
// it is nil.
func ZerosLayer(t testing.TB, f Format, name string, size int64) *Layer {
	t.Helper()
	gen := func(w io.Writer) error {
		tw := tar.NewWriter(w)
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(name, "/"), Mode: 0o644, Size: size, ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		zeros := make([]byte, 1<<20)
		for left := size; left > 0; {
			n := min(left, int64(len(zeros)))
			if _, err := tw.Write(zeros[:n]); err != nil {
				return err
			}
			left -= n
		}
		return tw.Close()
	}
	var blob bytes.Buffer
	zw, err := gzip.NewWriterLevel(&blob, gzip.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	tarHash := sha256.New()
	if err := gen(io.MultiWriter(zw, tarHash)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return &Layer{
		blob:      blob.Bytes(),
		gen:       gen,
		digest:    sha256Hash(blob.Bytes()),
		diffID:    v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(tarHash.Sum(nil))},
		mediaType: LayerMediaType(f, Gzip),
	}
}

// WithBlob returns a copy of l whose registry blob is blob (its digest and size follow
// it) while its diff ID stays l's: a layer whose stored data does not decompress to
// what the image config promises (corrupt, truncated or simply other content).
func (l *Layer) WithBlob(blob []byte) *Layer {
	c := *l
	c.blob = append([]byte(nil), blob...)
	c.digest = sha256Hash(c.blob)
	return &c
}

// Size returns the size of the compressed blob.
func (l *Layer) Size() (int64, error) { return int64(len(l.blob)), nil }

// MediaType returns the layer's media type.
func (l *Layer) MediaType() (types.MediaType, error) { return l.mediaType, nil }

// Blob returns the compressed bytes (do not modify them).
func (l *Layer) Blob() []byte { return l.blob }

// TarBytes returns the uncompressed tar stream (do not modify it).
func (l *Layer) TarBytes() []byte { return l.tar }

// ImageOptions describes an image made by NewImage.
type ImageOptions struct {
	// Format selects the manifest and config media types (OCI by default).
	Format Format
	// Platform is "os/arch[/variant]"; "linux/amd64" by default.
	Platform string
	// Config is the runtime configuration (Entrypoint, Cmd, Env, User, WorkingDir, ...).
	Config v1.Config
	// Annotations are set on the manifest (OCI only).
	Annotations map[string]string
}

// NewImage returns an image of layers (bottom first). Its config carries the platform
// and the layers' diff IDs; its creation time is fixed so the digest is reproducible.
func NewImage(t testing.TB, opts ImageOptions, layers ...v1.Layer) v1.Image {
	t.Helper()
	img := empty.Image
	if opts.Format == Docker {
		img = mutate.MediaType(img, types.DockerManifestSchema2)
		img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	} else {
		img = mutate.MediaType(img, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	}
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{Layer: l, History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "imagetest"}}
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		t.Fatalf("imagetest: append layers: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	p := ParsePlatform(t, opts.Platform)
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config = opts.Config
	cf.Created = v1.Time{Time: epoch}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	if len(opts.Annotations) > 0 {
		img = mutate.Annotations(img, opts.Annotations).(v1.Image)
	}
	return img
}

// ParsePlatform parses "os/arch[/variant]" ("" means linux/amd64).
func ParsePlatform(t testing.TB, s string) v1.Platform {
	t.Helper()
	if s == "" {
		s = "linux/amd64"
	}
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 {
		t.Fatalf("imagetest: bad platform %q, want os/arch[/variant]", s)
	}
	p := v1.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p
}

// BuildImage returns a linux/amd64 OCI image with one gzip layer per entry list.
func BuildImage(t testing.TB, layers ...[]TarEntry) v1.Image {
	t.Helper()
	ls := make([]v1.Layer, len(layers))
	for i, entries := range layers {
		ls[i] = NewLayer(t, OCI, Gzip, entries...)
	}
	return NewImage(t, ImageOptions{}, ls...)
}

// NewIndex returns an index (OCI image index or Docker manifest list, by f) of images,
// each entry's platform taken from the image's config.
func NewIndex(t testing.TB, f Format, images ...v1.Image) v1.ImageIndex {
	t.Helper()
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	if f == Docker {
		idx = mutate.IndexMediaType(empty.Index, types.DockerManifestList)
	}
	adds := make([]mutate.IndexAddendum, len(images))
	for i, img := range images {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		adds[i] = mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant},
		}}
	}
	return mutate.AppendManifests(idx, adds...)
}

// MultiPlatformIndex returns an index with a linux/amd64 and a linux/arm64 image whose
// layers differ (/etc/arch holds the architecture), plus an attestation manifest with
// platform unknown/unknown as docker buildx adds, which a puller must skip.
func MultiPlatformIndex(t testing.TB, f Format) (idx v1.ImageIndex, amd64, arm64 v1.Image) {
	t.Helper()
	mk := func(arch string) v1.Image {
		return NewImage(t, ImageOptions{Format: f, Platform: "linux/" + arch},
			NewLayer(t, f, Gzip, Dir("etc"), File("etc/arch", arch+"\n")))
	}
	amd64, arm64 = mk("amd64"), mk("arm64")
	att := NewImage(t, ImageOptions{Format: f, Platform: "unknown/unknown"},
		NewLayer(t, f, Uncompressed, File("attestation.json", "{}")))
	idx = NewIndex(t, f, arm64, amd64) // amd64 second: the puller must not just take the first
	ad, err := amd64.Digest()
	if err != nil {
		t.Fatal(err)
	}
	idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: att, Descriptor: v1.Descriptor{
		Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"},
		Annotations: map[string]string{
			"vnd.docker.reference.type":   "attestation-manifest",
			"vnd.docker.reference.digest": ad.String(),
		},
	}})
	return idx, amd64, arm64
}

// BusyboxPath is where Debian's busybox-static package installs its binary.
const BusyboxPath = "/bin/busybox"

// BusyboxEntries returns a minimal root filesystem: Debian's static busybox as
// /bin/busybox with a symlink for each of its applets (/bin/sh among them), /etc/passwd
// and /etc/group with root and nobody, and empty /tmp, /root, /proc, /sys and /dev.
func BusyboxEntries(t testing.TB) []TarEntry {
	t.Helper()
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		t.Fatalf("imagetest: %v (install Debian's busybox-static package)", err)
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		t.Fatalf("imagetest: %s --list: %v", BusyboxPath, err)
	}
	entries := []TarEntry{
		Dir("bin"), Dir("dev"), Dir("etc"), Dir("proc"), Dir("root"), Dir("sys"),
		{Type: TypeDir, Name: "tmp", Mode: 0o1777},
		File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"),
		File("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
		Executable("bin/busybox", bin),
	}
	sh := false
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		sh = sh || applet == "sh"
		entries = append(entries, Symlink("bin/"+applet, "busybox"))
	}
	if !sh {
		entries = append(entries, Symlink("bin/sh", "busybox"))
	}
	return entries
}

// BusyboxImage returns a linux/amd64 image of BusyboxEntries in one layer, with
// PATH set and /bin/sh as its command.
func BusyboxImage(t testing.TB, f Format, c Compression) v1.Image {
	t.Helper()
	return NewImage(t, ImageOptions{Format: f, Config: v1.Config{
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Cmd: []string{"/bin/sh"},
	}}, NewLayer(t, f, c, BusyboxEntries(t)...))
}

// Digest returns the digest of an image, an index or a layer.
func Digest(t testing.TB, x interface{ Digest() (v1.Hash, error) }) digest.Digest {
	t.Helper()
	h, err := x.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest.Digest(h.String())
}

// ConfigDigest returns the digest of img's config, which is its image ID.
func ConfigDigest(t testing.TB, img v1.Image) digest.Digest {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return digest.Digest(h.String())
}

// LayerDigests returns the digests of img's layer blobs, bottom first.
func LayerDigests(t testing.TB, img v1.Image) []digest.Digest {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]digest.Digest, len(ls))
	for i, l := range ls {
		out[i] = Digest(t, l)
	}
	return out
}

// Push uploads an image or an index to host as ref ("repo:tag", "repo@sha256:..." or
// "repo") and returns its digest. opts are passed to go-containerregistry's remote,
// e.g. remote.WithAuth(&authn.Basic{...}) for a registry started WithBasicAuth.
func Push(t testing.TB, host, ref string, obj any, opts ...remote.Option) digest.Digest {
	t.Helper()
	r, err := name.ParseReference(host+"/"+ref, name.Insecure)
	if err != nil {
		t.Fatalf("imagetest: push %s: %v", ref, err)
	}
	switch o := obj.(type) {
	case v1.ImageIndex:
		if err := remote.WriteIndex(r, o, opts...); err != nil {
			t.Fatalf("imagetest: push index %s: %v", r, err)
		}
		return Digest(t, o)
	case v1.Image:
		if err := remote.Write(r, o, opts...); err != nil {
			t.Fatalf("imagetest: push image %s: %v", r, err)
		}
		return Digest(t, o)
	default:
		t.Fatalf("imagetest: push %s: %T is neither a v1.Image nor a v1.ImageIndex", ref, obj)
		return ""
	}
}
